/**
 * Notices (notices.ts) as JupyterLab notifications, with their buttons: Keep
 * alive, Open GPU panel, Start a new kernel. Muted (a setting), nothing is shown:
 * the status bar and the panel still say everything.
 */

import type { JupyterFrontEnd } from '@jupyterlab/application';
import { Notification } from '@jupyterlab/apputils';

import { keepAlive } from './actions';
import { __ } from './i18n';
import type { PoolModel } from './model';
import type { Notebooks } from './notebooks';
import { INotice, INoticeChanges, NoticeBook, shortName } from './notices';

export class Toasts {
  constructor(
    private readonly _app: JupyterFrontEnd,
    private readonly _model: PoolModel,
    private readonly _notebooks: Notebooks,
    private readonly _openPanel: () => void
  ) {
    _model.changed.connect(() => {
      const me = _model.me;
      if (!me) {
        return;
      }
      if (!this._book) {
        this._book = new NoticeBook(me.now);
      }
      this._apply(this._book.fromState(me));
    });
    _model.kernelEvent.connect((_, event) => {
      if (this._book) {
        this._apply(this._book.fromEvent(event, _model.serverNow()));
      }
    });
    _notebooks.restarted.connect((_, path) => {
      if (!this.muted) {
        Notification.info(
          __(
            'A new kernel started for %1: the variables from before the shutdown are gone. Run your cells again from the top.',
            shortName(path)
          ),
          {
            autoClose: false,
            actions: [
              {
                label: __('Run all cells'),
                displayType: 'accent',
                callback: () => void this._app.commands.execute('notebook:run-all-cells')
              }
            ]
          }
        );
      }
    });
  }

  /** No notifications while muted (what would have been shown is not shown later either). */
  muted = false;

  private _apply(changes: INoticeChanges): void {
    for (const key of changes.dismiss) {
      const id = this._shown.get(key);
      if (id) {
        Notification.dismiss(id);
        this._shown.delete(key);
      }
    }
    for (const notice of changes.show) {
      if (this._shown.has(notice.key)) {
        continue;
      }
      if (notice.kernelGone) {
        // JupyterLab learns of a kernel ended by the server only at its next poll; ask now,
        // so that the notebook says "No Kernel" instead of a stale "Idle", and starts no fresh
        // kernel behind the user's back.
        this._notebooks.markGone(notice.kernelId);
        void this._app.serviceManager.sessions.refreshRunning();
        void this._app.serviceManager.kernels.refreshRunning();
      }
      if (!this.muted) {
        this._shown.set(notice.key, this._emit(notice));
      }
    }
  }

  private _emit(notice: INotice): string {
    const buttons: Notification.IAction[] = [];
    if (notice.keepAlive) {
      buttons.push({
        label: __('Keep alive'),
        caption: __('Postpone this action: the kernel keeps its GPU slice'),
        displayType: 'accent',
        callback: () => {
          this._shown.delete(notice.key); // the toast closes; its answer comes as a toast of its own
          void keepAlive(this._model, notice.kernelId);
        }
      });
    }
    if (notice.newKernel && this._notebooks.has(notice.kernelId)) {
      buttons.push({
        label: __('Start a new kernel'),
        caption: __('A fresh kernel of the same kind: run your cells again, top to bottom'),
        displayType: 'accent',
        callback: () => {
          this._shown.delete(notice.key);
          void this._notebooks.startNewKernel(notice.kernelId, id =>
            this._app.shell.activateById(id)
          );
        }
      });
    }
    if (notice.openPanel || notice.newKernel) {
      buttons.push({ label: __('Open GPU panel'), displayType: 'link', callback: this._openPanel });
    }
    return Notification.emit(notice.message, notice.type, {
      autoClose: notice.autoClose,
      actions: buttons
    });
  }

  private _book: NoticeBook | null = null;
  private _shown = new Map<string, string>(); // notice key -> notification id
}
