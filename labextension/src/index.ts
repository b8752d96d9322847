/**
 * jupyter-gpu-pool's JupyterLab extension: the user's GPU quota and kernels in
 * the status bar and a side panel, warnings before a cull or hibernation,
 * explanations afterwards, the slice of each notebook's kernel, commands on the
 * current notebook's kernel (Kernel menu), and the admins' pool dashboard.
 */

import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette, MainAreaWidget, WidgetTracker } from '@jupyterlab/apputils';
import { DocumentRegistry, DocumentWidget } from '@jupyterlab/docregistry';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import { ITranslator } from '@jupyterlab/translation';
import { Signal } from '@lumino/signaling';

import { adminAct, runAction } from './actions';
import { PoolClient } from './api';
import type { IActions } from './components';
import { followRefusalDialogs, oneKernelErrorDialog } from './dialogs';
import { __, setTranslator } from './i18n';
import { Hints } from './hints';
import { followLaunchers } from './launcher';
import { PoolModel } from './model';
import { Notebooks } from './notebooks';
import { AdminRequests } from './requests';
import { Toasts } from './toasts';
import type { IKernel, KernelAction } from './types';
import { actionViews, complete } from './view';
import { DashboardWidget, GpuPanel, SliceIndicator, StatusWidget, gpuIcon } from './widgets';

const PLUGIN_ID = 'jupyter-gpu-pool:plugin';

namespace CommandIDs {
  export const openPanel = 'gpu-pool:open-panel';
  export const openDashboard = 'gpu-pool:open-dashboard';
  export const keepAlive = 'gpu-pool:keep-alive';
  export const release = 'gpu-pool:release';
  export const resume = 'gpu-pool:resume';
}

/** The user's settings (schema/plugin.json). */
interface ISettings {
  pollInterval: number;
  muteNotifications: boolean;
  hideStatusItem: boolean;
}

const DEFAULTS: ISettings = { pollInterval: 3, muteNotifications: false, hideStatusItem: false };

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description:
    'GPU quota, slices, utilization, idle warnings and the pool dashboard of jupyter-gpu-pool.',
  autoStart: true,
  optional: [IStatusBar, ICommandPalette, ILayoutRestorer, ISettingRegistry, ITranslator],
  activate: (
    app: JupyterFrontEnd,
    statusBar: IStatusBar | null,
    palette: ICommandPalette | null,
    restorer: ILayoutRestorer | null,
    settingRegistry: ISettingRegistry | null,
    translator: ITranslator | null
  ) => {
    if (translator) {
      setTranslator(translator);
    }
    const { serviceManager, commands, shell } = app;
    const client = new PoolClient(serviceManager.serverSettings);
    const model = new PoolModel({ client, events: serviceManager.events });
    const notebooks = new Notebooks();
    const hints = new Hints(model);
    const hintCurrent = () => {
      if (document.visibilityState === 'visible') {
        hints.touch(notebooks.currentKernelId());
      }
    };
    const settings: ISettings = { ...DEFAULTS };
    const statusChanged = new Signal<unknown, void>(plugin);

    const openPanel = () => {
      if (!panel.isAttached) {
        shell.add(panel, 'right', { rank: 700 });
      }
      shell.activateById(panel.id);
    };

    const toasts = new Toasts(app, model, notebooks, () => openPanel());
    const requests = new AdminRequests(toasts);
    model.changed.connect(() => {
      if (model.pool) {
        requests.follow(model.pool);
      }
    });
    const actions: IActions = {
      run: (kernelId, action, opener) =>
        runAction(
          app,
          model,
          { kernel_id: kernelId, name: kernelName(kernelId) },
          action,
          opener,
          toasts
        ),
      open: path => void commands.execute('docmanager:open', { path }),
      waiting: kernelId => notebooks.busy(kernelId)
    };
    const kernelName = (kernelId: string) =>
      model.me?.kernels.find(k => k.kernel_id === kernelId)?.name ?? '';

    const panel = new GpuPanel(
      model,
      notebooks,
      actions,
      () => void commands.execute(CommandIDs.openDashboard)
    );
    shell.add(panel, 'right', { rank: 700 });
    restorer?.add(panel, 'jupyter-gpu-pool:panel');

    // The admin dashboard: one main-area widget, restored with the layout.
    const dashboards = new WidgetTracker<MainAreaWidget<DashboardWidget>>({
      namespace: 'jupyter-gpu-pool-dashboard'
    });
    const openDashboard = () => {
      let widget = dashboards.currentWidget;
      if (!widget || widget.isDisposed) {
        const content = new DashboardWidget(model, {
          act: (row, action, opener) => adminAct(model, row, action, opener, toasts, requests),
          open: path => void commands.execute('docmanager:open', { path }),
          request: kernelId => requests.view(kernelId)
        });
        widget = new MainAreaWidget({ content });
        widget.id = 'jp-gpu-pool-dashboard-area';
        widget.title.icon = gpuIcon;
        widget.title.label = __('GPU pool');
        widget.title.closable = true;
        void dashboards.add(widget);
      }
      if (!widget.isAttached) {
        shell.add(widget, 'main');
      }
      shell.activateById(widget.id);
      return widget;
    };
    restorer?.restore(dashboards, { command: CommandIDs.openDashboard, name: () => 'dashboard' });

    // The current notebook's GPU kernel, for the Kernel menu's commands.
    const current = (): IKernel | null => {
      const id = notebooks.currentKernelId();
      const found = id ? model.me?.kernels.find(k => k.kernel_id === id) : undefined;
      return found ? complete(found) : null;
    };
    const currentAction = (action: KernelAction) =>
      (() => {
        const k = current();
        return k ? (actionViews(k).find(a => a.action === action) ?? null) : null;
      })();
    const runCurrent = async (action: KernelAction) => {
      const k = current();
      const view = currentAction(action);
      if (k && view) {
        await runAction(app, model, k, view, document.activeElement as HTMLElement | null, toasts);
      }
    };

    commands.addCommand(CommandIDs.openPanel, {
      label: __('GPU Pool Panel'),
      caption: __('Your GPU kernels, their slices and your quota'),
      icon: args => (args['isPalette'] ? undefined : gpuIcon),
      execute: openPanel
    });
    commands.addCommand(CommandIDs.openDashboard, {
      label: __('GPU Pool Dashboard'),
      caption: __('Every GPU, kernel and decision of the pool (admins)'),
      icon: args => (args['isPalette'] ? undefined : gpuIcon),
      isVisible: () => !!model.me?.admin || dashboards.size > 0,
      isEnabled: () => !!model.me?.admin || dashboards.size > 0,
      execute: () => openDashboard()
    });
    commands.addCommand(CommandIDs.keepAlive, {
      label: __('Keep GPU Kernel Alive'),
      caption: __('Postpone the pending shutdown or hibernation of this notebook’s GPU kernel'),
      isEnabled: () => currentAction('snooze') !== null,
      execute: () => runCurrent('snooze')
    });
    commands.addCommand(CommandIDs.release, {
      label: __('Release GPU Slice'),
      caption: __('Give this notebook’s GPU slice back now (hibernate where its rule says so)'),
      isEnabled: () => currentAction('release') !== null,
      execute: () => runCurrent('release')
    });
    commands.addCommand(CommandIDs.resume, {
      label: __('Resume GPU Kernel'),
      caption: __('Take a GPU slice again for this notebook’s hibernated kernel'),
      isEnabled: () => currentAction('resume') !== null,
      execute: () => runCurrent('resume')
    });
    const category = __('GPU Pool');
    for (const command of Object.values(CommandIDs)) {
      palette?.addItem({ command, category });
    }
    // Enabled states follow the pool and the current notebook.
    const refreshCommands = () => {
      for (const command of Object.values(CommandIDs)) {
        commands.notifyCommandChanged(command);
      }
    };
    model.changed.connect(refreshCommands);
    notebooks.tracker.currentChanged.connect(refreshCommands);
    // Resume before the cell runs: the notebook opened or focused (in JupyterLab, or the browser tab).
    notebooks.tracker.currentChanged.connect(hintCurrent);
    window.addEventListener('focus', hintCurrent);

    if (statusBar) {
      statusBar.registerStatusItem(PLUGIN_ID, {
        item: new StatusWidget(model, openPanel),
        align: 'left',
        rank: 50,
        isActive: () => !settings.hideStatusItem,
        activeStateChanged: statusChanged
      });
    }

    // The slice each notebook's kernel holds. JupyterLab's toolbar moves its last items into its
    // "…" menu when the notebook is narrow (the kernel's name among the first): the indicator goes
    // before the cell type, so that where the GPU is (and "declared") stays in sight at 1024 px.
    app.docRegistry.addWidgetExtension('Notebook', {
      createNew: (
        widget: DocumentWidget,
        context: DocumentRegistry.IContext<DocumentRegistry.IModel>
      ) => {
        notebooks.add(widget, context);
        // Resume before the cell runs: a cell's editor focused or typed in, and the notebook's kernel known.
        const kernelOf = () => context.sessionContext.session?.kernel?.id;
        const editing = (event: Event) => {
          if ((event.target as Element | null)?.closest?.('.jp-Cell')) {
            hints.touch(kernelOf());
          }
        };
        widget.node.addEventListener('focusin', editing);
        widget.node.addEventListener('keydown', editing);
        context.sessionContext.ready
          .then(() => {
            if (notebooks.tracker.currentWidget === widget) {
              hintCurrent();
            }
          })
          .catch(() => undefined);
        const indicator = new SliceIndicator(model, context.sessionContext, openPanel);
        const placed =
          widget.toolbar.insertBefore('cellType', 'gpuPoolSlice', indicator) ||
          widget.toolbar.insertAfter('kernelName', 'gpuPoolSlice', indicator);
        if (!placed) {
          widget.toolbar.addItem('gpuPoolSlice', indicator);
        }
        return indicator;
      }
    });

    followRefusalDialogs(() => model.me?.profiles ?? []);
    // JupyterLab's own titles for these dialogs, in the user's language (as its session context words them).
    const lab = translator?.load('jupyterlab') ?? null;
    oneKernelErrorDialog(
      {
        error: lab?.__('Error Starting Kernel') || 'Error Starting Kernel',
        select: lab?.__('Select Kernel') || 'Select Kernel'
      },
      () => model.me?.profiles ?? [],
      message => toasts.kernelError(message)
    );
    followLaunchers(commands, model);

    if (settingRegistry) {
      const apply = (loaded: ISettingRegistry.ISettings) => {
        const composite = loaded.composite as unknown as Partial<ISettings>;
        settings.pollInterval = composite.pollInterval ?? DEFAULTS.pollInterval;
        settings.muteNotifications = composite.muteNotifications ?? DEFAULTS.muteNotifications;
        settings.hideStatusItem = composite.hideStatusItem ?? DEFAULTS.hideStatusItem;
        model.interval = settings.pollInterval * 1000;
        toasts.muted = settings.muteNotifications;
        statusChanged.emit();
      };
      settingRegistry
        .load(PLUGIN_ID)
        .then(loaded => {
          apply(loaded);
          loaded.changed.connect(apply);
        })
        .catch(reason => console.error(`${PLUGIN_ID}: could not load the settings`, reason));
    }
    console.debug(`${PLUGIN_ID} activated`);
  }
};

export default plugin;
