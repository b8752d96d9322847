/**
 * The extension's commands: the GPU panel, the admins' dashboard (one main-area
 * widget, restored with the layout), and the Kernel menu's actions on the
 * current notebook's GPU kernel, in the palette under "GPU Pool".
 */

import { ILayoutRestorer, JupyterFrontEnd } from '@jupyterlab/application';
import { ICommandPalette, MainAreaWidget, WidgetTracker } from '@jupyterlab/apputils';

import { adminAct, runAction } from './actions';
import { __ } from './i18n';
import { PoolModel } from './model';
import { Notebooks } from './notebooks';
import { AdminRequests } from './requests';
import { Toasts } from './toasts';
import type { IKernel, KernelAction } from './types';
import { actionViews, complete } from './view';
import { DashboardWidget, gpuIcon } from './widgets';

export namespace CommandIDs {
  export const openPanel = 'gpu-pool:open-panel';
  export const openDashboard = 'gpu-pool:open-dashboard';
  export const keepAlive = 'gpu-pool:keep-alive';
  export const release = 'gpu-pool:release';
  export const resume = 'gpu-pool:resume';
}

/** What the commands act through. */
export interface ICommandParts {
  app: JupyterFrontEnd;
  model: PoolModel;
  notebooks: Notebooks;
  toasts: Toasts;
  requests: AdminRequests;
  openPanel: () => void;
}

/** The dashboard's opener: the one widget, made again once closed. */
function dashboardOpener(
  parts: ICommandParts,
  restorer: ILayoutRestorer | null
): { open: () => MainAreaWidget<DashboardWidget>; isOpen: () => boolean } {
  const { app, model, toasts, requests } = parts;
  const dashboards = new WidgetTracker<MainAreaWidget<DashboardWidget>>({
    namespace: 'jupyter-gpu-pool-dashboard'
  });
  const open = () => {
    let widget = dashboards.currentWidget;
    if (!widget || widget.isDisposed) {
      const content = new DashboardWidget(model, {
        act: (row, action, opener) => adminAct(model, row, action, opener, toasts, requests),
        open: path => void app.commands.execute('docmanager:open', { path }),
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
      app.shell.add(widget, 'main');
    }
    app.shell.activateById(widget.id);
    return widget;
  };
  restorer?.restore(dashboards, { command: CommandIDs.openDashboard, name: () => 'dashboard' });
  return { open, isOpen: () => dashboards.size > 0 };
}

/** The Kernel menu's commands on the current notebook's GPU kernel: enabled where its card offers the action. */
function addKernelCommands(parts: ICommandParts): void {
  const { app, model, notebooks, toasts } = parts;
  const current = (): IKernel | null => {
    const id = notebooks.currentKernelId();
    const found = id ? model.me?.kernels.find(k => k.kernel_id === id) : undefined;
    return found ? complete(found) : null;
  };
  const offered = (action: KernelAction) => {
    const k = current();
    return k ? (actionViews(k).find(a => a.action === action) ?? null) : null;
  };
  const run = async (action: KernelAction) => {
    const k = current();
    const view = offered(action);
    if (k && view) {
      await runAction(app, model, k, view, document.activeElement as HTMLElement | null, toasts);
    }
  };
  const kernelCommands: [string, KernelAction, string, string][] = [
    [
      CommandIDs.keepAlive,
      'snooze',
      __('Keep GPU Kernel Alive'),
      __('Postpone the pending shutdown or hibernation of this notebook’s GPU kernel')
    ],
    [
      CommandIDs.release,
      'release',
      __('Release GPU Slice'),
      __('Give this notebook’s GPU slice back now (hibernate where its rule says so)')
    ],
    [
      CommandIDs.resume,
      'resume',
      __('Resume GPU Kernel'),
      __('Take a GPU slice again for this notebook’s hibernated kernel')
    ]
  ];
  for (const [id, action, label, caption] of kernelCommands) {
    app.commands.addCommand(id, {
      label,
      caption,
      isEnabled: () => offered(action) !== null,
      execute: () => run(action)
    });
  }
}

/** Every command, in the palette; their enabled states follow the pool and the current notebook. */
export function addCommands(
  parts: ICommandParts,
  palette: ICommandPalette | null,
  restorer: ILayoutRestorer | null
): void {
  const { app, model, notebooks } = parts;
  const dashboard = dashboardOpener(parts, restorer);
  app.commands.addCommand(CommandIDs.openPanel, {
    label: __('GPU Pool Panel'),
    caption: __('Your GPU kernels, their slices and your quota'),
    icon: args => (args['isPalette'] ? undefined : gpuIcon),
    execute: parts.openPanel
  });
  app.commands.addCommand(CommandIDs.openDashboard, {
    label: __('GPU Pool Dashboard'),
    caption: __('Every GPU, kernel and decision of the pool (admins)'),
    icon: args => (args['isPalette'] ? undefined : gpuIcon),
    isVisible: () => !!model.me?.admin || dashboard.isOpen(),
    isEnabled: () => !!model.me?.admin || dashboard.isOpen(),
    execute: () => dashboard.open()
  });
  addKernelCommands(parts);
  const category = __('GPU Pool');
  for (const command of Object.values(CommandIDs)) {
    palette?.addItem({ command, category });
  }
  const refresh = () => {
    for (const command of Object.values(CommandIDs)) {
      app.commands.notifyCommandChanged(command);
    }
  };
  model.changed.connect(refresh);
  notebooks.tracker.currentChanged.connect(refresh);
}
