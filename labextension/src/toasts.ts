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
import { INotice, INoticeChanges, NoticeBook, shortName, toHide } from './notices';

/** The data of a toast about one kernel: a later notice about that kernel withdraws it. */
export interface IKernelToastData {
  gpuPoolKernel: string;
}

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
      this._closed.add(key); // withdrawn: the fact changed; it never comes back
    }
    for (const notice of changes.show) {
      if (this._shown.has(notice.key) || this._closed.has(notice.key)) {
        continue;
      }
      this._withdrawAbout(notice.kernelId);
      if (notice.kernelGone) {
        // JupyterLab learns of a kernel ended by the server only at its next poll; ask now,
        // so that the notebook says "No Kernel" instead of a stale "Idle", and starts no fresh
        // kernel behind the user's back.
        this._notebooks.markGone(notice.kernelId);
        void this._app.serviceManager.sessions.refreshRunning();
        void this._app.serviceManager.kernels.refreshRunning();
      }
      if (!this.muted) {
        const id = this._emit(notice);
        this._shown.set(notice.key, id);
        this._order.push({ id, warning: notice.key.startsWith('warning:') });
      }
    }
    this._limitOnScreen();
  }

  /**
   * Toasts of the last action on this kernel ("kept alive: it keeps its GPU slice", "hibernates:
   * …"): a newer notice about the kernel says what is true now, so they go.
   */
  private _withdrawAbout(kernelId: string): void {
    for (const n of Notification.manager.notifications) {
      if ((n.options.data as IKernelToastData | undefined)?.gpuPoolKernel === kernelId) {
        Notification.dismiss(n.id);
      }
    }
  }

  /**
   * At most MAX_ON_SCREEN of our toasts on screen: eight stacked toasts covered the panel and ran
   * off the window. The rest leave the screen but stay in JupyterLab's notification centre (an
   * update that closes the toast at once keeps the notification).
   */
  private _limitOnScreen(): void {
    const live = new Set(Notification.manager.notifications.map(n => n.id));
    this._order = this._order.filter(t => live.has(t.id));
    const onScreen = this._order.filter(t => document.getElementById(t.id) !== null);
    for (const id of toHide(onScreen)) {
      const n = Notification.manager.notifications.find(x => x.id === id);
      if (n) {
        Notification.update({ id, message: n.message, autoClose: 1 });
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
          this._closed.add(notice.key);
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
          this._closed.add(notice.key);
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
  private _closed = new Set<string>(); // notice keys whose toast the user closed: never again
  private _order: { id: string; warning: boolean }[] = []; // our notifications, oldest first
}
