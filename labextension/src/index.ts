/**
 * jupyter-gpu-pool's JupyterLab extension: the user's GPU quota and kernels in
 * the status bar and a side panel, warnings before a cull or hibernation (with
 * Keep alive), explanations afterwards, and the slice of each notebook's kernel.
 */

import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import {
  Dialog,
  ICommandPalette,
  Notification,
  showDialog
} from '@jupyterlab/apputils';
import { DocumentRegistry, DocumentWidget } from '@jupyterlab/docregistry';
import { IStatusBar } from '@jupyterlab/statusbar';

import { PoolClient } from './api';
import type { IActions } from './components';
import { PoolModel } from './model';
import { INotice, INoticeChanges, NoticeBook, shortName } from './notices';
import type { KernelAction } from './types';
import { GpuPanel, SliceIndicator, StatusWidget } from './widgets';

const PLUGIN_ID = 'jupyter-gpu-pool:plugin';

namespace CommandIDs {
  export const openPanel = 'gpu-pool:open-panel';
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'GPU quota, slices, utilization and idle warnings of jupyter-gpu-pool.',
  autoStart: true,
  optional: [IStatusBar, ICommandPalette],
  activate: (
    app: JupyterFrontEnd,
    statusBar: IStatusBar | null,
    palette: ICommandPalette | null
  ) => {
    const { serviceManager, commands, shell } = app;
    const client = new PoolClient(serviceManager.serverSettings);
    const model = new PoolModel({ client, events: serviceManager.events });

    const openPanel = () => {
      if (!panel.isAttached) {
        shell.add(panel, 'right', { rank: 700 });
      }
      shell.activateById(panel.id);
    };

    const actions: IActions = {
      run: (kernelId, action, confirm) => runAction(app, model, kernelId, action, confirm),
      open: path => void commands.execute('docmanager:open', { path })
    };

    const panel = new GpuPanel(model, actions);
    shell.add(panel, 'right', { rank: 700 });

    commands.addCommand(CommandIDs.openPanel, {
      label: 'Show the GPU pool panel',
      caption: 'Your GPU kernels, their slices and your quota',
      execute: openPanel
    });
    palette?.addItem({ command: CommandIDs.openPanel, category: 'GPU pool' });

    if (statusBar) {
      statusBar.registerStatusItem(PLUGIN_ID, {
        item: new StatusWidget(model, openPanel),
        align: 'left',
        rank: 50,
        isActive: () => true
      });
    }

    // The slice each notebook's kernel holds, next to the kernel's name.
    app.docRegistry.addWidgetExtension('Notebook', {
      createNew: (widget: DocumentWidget, context: DocumentRegistry.IContext<DocumentRegistry.IModel>) => {
        const indicator = new SliceIndicator(model, context.sessionContext, openPanel);
        widget.toolbar.insertAfter('kernelName', 'gpuPoolSlice', indicator);
        return indicator;
      }
    });

    wireNotifications(app, model, openPanel);
    console.debug(`${PLUGIN_ID} activated`);
  }
};

/** Turn notices (notices.ts) into JupyterLab notifications, with Keep alive and Open panel buttons. */
function wireNotifications(app: JupyterFrontEnd, model: PoolModel, openPanel: () => void): void {
  let book: NoticeBook | null = null;
  const shown = new Map<string, string>(); // notice key -> notification id

  const apply = (changes: INoticeChanges) => {
    for (const key of changes.dismiss) {
      const id = shown.get(key);
      if (id) {
        Notification.dismiss(id);
        shown.delete(key);
      }
    }
    for (const notice of changes.show) {
      if (!shown.has(notice.key)) {
        shown.set(notice.key, emit(notice));
        if (notice.kernelGone) {
          // JupyterLab learns of a kernel ended by the server only at its next poll; ask now,
          // so that the notebook says "No Kernel" instead of a stale "Idle".
          void app.serviceManager.sessions.refreshRunning();
          void app.serviceManager.kernels.refreshRunning();
        }
      }
    }
  };

  const emit = (notice: INotice): string => {
    const buttons: Notification.IAction[] = [];
    if (notice.keepAlive) {
      buttons.push({
        label: 'Keep alive',
        caption: 'Postpone this action: the kernel keeps its GPU slice',
        displayType: 'accent',
        callback: () => {
          shown.delete(notice.key); // the toast closes; its answer comes as a toast of its own
          void keepAlive(model, notice);
        }
      });
    }
    if (notice.openPanel) {
      buttons.push({ label: 'Open GPU panel', displayType: 'link', callback: openPanel });
    }
    return Notification.emit(notice.message, notice.type, {
      autoClose: notice.autoClose,
      actions: buttons
    });
  };

  model.changed.connect(() => {
    const me = model.me;
    if (!me) {
      return;
    }
    if (!book) {
      book = new NoticeBook(me.now);
    }
    apply(book.fromState(me));
  });
  model.kernelEvent.connect((_, event) => {
    if (book) {
      apply(book.fromEvent(event, model.serverNow()));
    }
  });
}

async function keepAlive(model: PoolModel, notice: INotice): Promise<void> {
  try {
    const kernel = await model.client.snooze(notice.kernelId);
    Notification.success(`${shortName(kernel?.name, 'The kernel')} is kept alive: it keeps its GPU slice.`, {
      autoClose: 5000
    });
  } catch (error) {
    Notification.error(`Could not keep the kernel alive: ${(error as Error).message}`, { autoClose: false });
  }
  await model.refresh();
}

async function runAction(
  app: JupyterFrontEnd,
  model: PoolModel,
  kernelId: string,
  action: KernelAction,
  confirm: string | null
): Promise<void> {
  if (confirm) {
    const result = await showDialog({
      title: action === 'shutdown' ? 'Shut down kernel' : 'Release GPU',
      body: confirm,
      buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: action === 'shutdown' ? 'Shut down' : 'Release' })]
    });
    if (!result.button.accept) {
      return;
    }
  }
  try {
    switch (action) {
      case 'snooze':
        await model.client.snooze(kernelId);
        break;
      case 'release': {
        const { action: done } = await model.client.release(kernelId);
        Notification.info(
          done === 'hibernate'
            ? 'Hibernating: the GPU slice is given back, the variables stay in host memory.'
            : 'Shutting the kernel down to give its GPU slice back.',
          { autoClose: 4000 }
        );
        break;
      }
      case 'resume':
        await model.client.resume(kernelId);
        break;
      case 'shutdown':
        await shutdownKernel(app, kernelId);
        break;
    }
  } catch (error) {
    Notification.error(`GPU pool: ${(error as Error).message}`, { autoClose: false });
  }
  await model.refresh();
}

/** Shut down the kernel through its session (so the notebook shows "No Kernel"), else directly. */
async function shutdownKernel(app: JupyterFrontEnd, kernelId: string): Promise<void> {
  const { sessions, kernels } = app.serviceManager;
  await sessions.refreshRunning();
  for (const session of sessions.running()) {
    if (session.kernel?.id === kernelId) {
      await sessions.shutdown(session.id);
      return;
    }
  }
  await kernels.shutdown(kernelId);
}

export default plugin;
