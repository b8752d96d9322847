/**
 * jupyter-gpu-pool's JupyterLab extension: the user's GPU quota and kernels in
 * the status bar and a side panel, warnings before a cull or hibernation,
 * explanations afterwards, the slice of each notebook's kernel, commands on the
 * current notebook's kernel (Kernel menu), and the admins' pool dashboard.
 */

import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import { ITranslator } from '@jupyterlab/translation';
import { Signal } from '@lumino/signaling';

import { runAction } from './actions';
import { PoolClient } from './api';
import { CommandIDs, addCommands } from './commands';
import type { IActions } from './components';
import { followRefusalDialogs, oneKernelErrorDialog } from './dialogs';
import { setTranslator } from './i18n';
import { Hints } from './hints';
import { followLaunchers } from './launcher';
import { PoolModel } from './model';
import { Notebooks } from './notebooks';
import { AdminRequests } from './requests';
import { DEFAULTS, ISettings, followSettings } from './settings';
import { Toasts } from './toasts';
import { extendNotebooks } from './toolbar';
import { GpuPanel, StatusWidget } from './widgets';

const PLUGIN_ID = 'jupyter-gpu-pool:plugin';

/** The side panel of the user's GPU kernels, with what its cards' buttons do. */
function addPanel(
  app: JupyterFrontEnd,
  model: PoolModel,
  notebooks: Notebooks,
  toasts: () => Toasts,
  restorer: ILayoutRestorer | null
): GpuPanel {
  const kernelName = (kernelId: string) =>
    model.me?.kernels.find(k => k.kernel_id === kernelId)?.name ?? '';
  const actions: IActions = {
    run: (kernelId, action, opener) =>
      runAction(
        app,
        model,
        { kernel_id: kernelId, name: kernelName(kernelId) },
        action,
        opener,
        toasts()
      ),
    open: path => void app.commands.execute('docmanager:open', { path }),
    waiting: kernelId => notebooks.busy(kernelId)
  };
  const panel = new GpuPanel(
    model,
    notebooks,
    actions,
    () => void app.commands.execute(CommandIDs.openDashboard)
  );
  app.shell.add(panel, 'right', { rank: 700 });
  restorer?.add(panel, 'jupyter-gpu-pool:panel');
  return panel;
}

/** JupyterLab's own kernel dialogs, followed: a refusal's words, one error dialog for a failed start. */
function followDialogs(model: PoolModel, toasts: Toasts, translator: ITranslator | null): void {
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
}

/** The status bar's item, and the user's settings: the poll interval, muted toasts, the item hidden. */
function addStatusItem(
  statusBar: IStatusBar | null,
  settingRegistry: ISettingRegistry | null,
  model: PoolModel,
  toasts: Toasts,
  openPanel: () => void
): void {
  const settings: ISettings = { ...DEFAULTS };
  const statusChanged = new Signal<unknown, void>(model);
  statusBar?.registerStatusItem(PLUGIN_ID, {
    item: new StatusWidget(model, openPanel),
    align: 'left',
    rank: 50,
    isActive: () => !settings.hideStatusItem,
    activeStateChanged: statusChanged
  });
  if (settingRegistry) {
    followSettings(settingRegistry, PLUGIN_ID, settings, () => {
      model.interval = settings.pollInterval * 1000;
      toasts.muted = settings.muteNotifications;
      statusChanged.emit();
    });
  }
}

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
    const { serviceManager, shell } = app;
    const model = new PoolModel({
      client: new PoolClient(serviceManager.serverSettings),
      events: serviceManager.events
    });
    const notebooks = new Notebooks();
    const hints = new Hints(model);
    const hintCurrent = () => {
      if (document.visibilityState === 'visible') {
        hints.touch(notebooks.currentKernelId());
      }
    };
    const panel = addPanel(app, model, notebooks, () => toasts, restorer);
    const openPanel = () => {
      if (!panel.isAttached) {
        shell.add(panel, 'right', { rank: 700 });
      }
      shell.activateById(panel.id);
    };
    const toasts = new Toasts(app, model, notebooks, openPanel);
    const requests = new AdminRequests(toasts);
    model.changed.connect(() => {
      if (model.pool) {
        requests.follow(model.pool);
      }
    });
    addCommands({ app, model, notebooks, toasts, requests, openPanel }, palette, restorer);
    // Resume before the cell runs: the notebook opened or focused (in JupyterLab, or the browser tab).
    notebooks.tracker.currentChanged.connect(hintCurrent);
    window.addEventListener('focus', hintCurrent);

    addStatusItem(statusBar, settingRegistry, model, toasts, openPanel);
    extendNotebooks(app, model, notebooks, hints, hintCurrent, openPanel);
    followDialogs(model, toasts, translator);
    followLaunchers(app.commands, model);
    console.debug(`${PLUGIN_ID} activated`);
  }
};

export default plugin;
