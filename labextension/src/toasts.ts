/**
 * Notices (notices.ts) as JupyterLab notifications, with their buttons: Keep
 * alive, Open GPU panel, Start a new kernel. Muted (a setting), nothing is shown:
 * the status bar and the panel still say everything.
 */

import type { JupyterFrontEnd } from '@jupyterlab/application';
import { Notification } from '@jupyterlab/apputils';

import { keepAlive, release } from './actions';
import { __ } from './i18n';
import type { PoolModel } from './model';
import type { Notebooks } from './notebooks';
import {
  fit,
  INotice,
  INoticeChanges,
  MAX_ON_SCREEN,
  NoticeBook,
  shortName,
  toHide
} from './notices';
import { counted, Repeats } from './repeats';

/** Milliseconds a toast just emitted counts as on screen before JupyterLab has rendered it. */
const RENDER_MS = 2000;

interface IShownToast {
  id: string;
  warning: boolean;
  /** When it was emitted (Date.now()). */
  at: number;
  /** Seen on screen once. */
  rendered: boolean;
  /** Sent to the centre only, or taken off the screen by us. */
  off: boolean;
}

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

  /**
   * A kernel's start failed and JupyterLab's dialog for it was not shown (one is on screen
   * already: dialogs.ts): its message as a toast, counted with the same ones.
   */
  kernelError(message: string): void {
    this._apply({
      show: [
        {
          key: `kernel-error:${++this._errors}`,
          kernelId: '',
          type: 'error',
          message: fit(__('A kernel could not start: %1', message.trim())),
          keepAlive: false,
          openPanel: false,
          newKernel: false,
          autoClose: false,
          kernelGone: false
        }
      ],
      dismiss: []
    });
  }

  private _apply(changes: INoticeChanges): void {
    for (const key of changes.dismiss) {
      const id = this._shown.get(key);
      if (id) {
        const left = this._repeats.remove(key);
        if (left && left.times > 0) {
          this._recount(id, counted(left.message, left.times)); // others still count on it: one fewer
        } else {
          Notification.dismiss(id);
        }
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
        const live = new Set(Notification.manager.notifications.map(n => n.id));
        const same = this._repeats.find(notice.message, id => live.has(id));
        if (same) {
          // The same text again: counted on the toast already there, updated in place (off the
          // screen, only its entry in the notification centre: autoClose 0 shows no toast).
          const times = this._repeats.add(notice.message, notice.key, same);
          this._recount(same, counted(notice.message, times));
          this._shown.set(notice.key, same);
          continue;
        }
        const warning = notice.key.startsWith('warning:');
        // Room on screen: a warning makes its own (the oldest other toast leaves the screen);
        // any other notice past the limit goes to the notification centre without a toast.
        const onScreen = this._onScreen();
        const silent = onScreen.length >= MAX_ON_SCREEN && !warning;
        if (warning) {
          // Only a rendered toast can leave the screen (an update of one not yet shown recreates it).
          const rendered = onScreen.filter(t => t.rendered);
          toHide(
            [...rendered, { id: '', warning: true }],
            MAX_ON_SCREEN + rendered.length - onScreen.length
          )
            .filter(Boolean)
            .forEach(id => this._offScreen(id));
        }
        const id = this._emit(notice, silent);
        this._repeats.add(notice.message, notice.key, id);
        this._shown.set(notice.key, id);
        this._order.push({ id, warning, at: Date.now(), rendered: false, off: silent });
      }
    }
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
   * Our toasts on screen now, oldest first: at most MAX_ON_SCREEN (eight stacked toasts covered
   * the panel and ran off the window). One just emitted counts before it renders; one closed
   * (by the user, or its autoClose) no longer does.
   */
  private _onScreen(): IShownToast[] {
    const live = new Set(Notification.manager.notifications.map(n => n.id));
    this._order = this._order.filter(t => live.has(t.id));
    return this._order.filter(t => {
      if (t.off) {
        return false;
      }
      if (document.getElementById(t.id) !== null) {
        t.rendered = true;
        return true;
      }
      return !t.rendered && Date.now() - t.at < RENDER_MS;
    });
  }

  /**
   * Say a toast's new count in place. A toast emitted a moment ago and not rendered yet would lose
   * the update (JupyterLab renders the text it was emitted with): it is said once the toast shows.
   */
  private _recount(id: string, message: string): void {
    this._counts.set(id, message);
    if (this._recounting.has(id)) {
      return; // the pending one says the latest count
    }
    const say = () => {
      const text = this._counts.get(id);
      const t = this._order.find(x => x.id === id);
      const rendering = t && !t.off && !t.rendered && Date.now() - t.at < RENDER_MS;
      if (rendering && document.getElementById(id) === null) {
        window.setTimeout(say, 100);
        return;
      }
      this._recounting.delete(id);
      if (text !== undefined && Notification.manager.notifications.some(n => n.id === id)) {
        Notification.update({ id, message: text, autoClose: this._isOnScreen(id) ? undefined : 0 });
      }
    };
    this._recounting.add(id);
    say();
  }

  private _isOnScreen(id: string): boolean {
    return this._onScreen().some(t => t.id === id);
  }

  /** Take a toast off the screen; its notification stays in the centre (an update that closes it at once). */
  private _offScreen(id: string): void {
    const t = this._order.find(x => x.id === id);
    const n = Notification.manager.notifications.find(x => x.id === id);
    if (t && n) {
      t.off = true;
      Notification.update({ id, message: n.message, autoClose: 1 });
    }
  }

  private _emit(notice: INotice, silent: boolean): string {
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
    if (notice.release) {
      buttons.push({
        label: __('Release now'),
        caption: __('Give the GPU slice back now, for whoever waits for one'),
        displayType: 'default',
        callback: () => {
          this._shown.delete(notice.key); // the toast closes; what was done comes as a toast of its own
          this._closed.add(notice.key);
          void (async () => {
            try {
              const name =
                this._model.me?.kernels.find(k => k.kernel_id === notice.kernelId)?.name ?? '';
              await release(this._model, { kernel_id: notice.kernelId, name });
            } catch (error) {
              Notification.error(__('GPU pool: %1', (error as Error).message), {
                autoClose: false
              });
            }
            await this._model.refresh();
          })();
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
      // autoClose 0: JupyterLab puts the notification in its centre and shows no toast.
      autoClose: silent ? 0 : notice.autoClose,
      actions: buttons
    });
  }

  private _book: NoticeBook | null = null;
  private _shown = new Map<string, string>(); // notice key -> notification id
  private _closed = new Set<string>(); // notice keys whose toast the user closed: never again
  private _order: IShownToast[] = []; // our notifications, oldest first
  private _repeats = new Repeats(); // which toast counts which notices of the same text
  private _errors = 0; // kernel-start errors whose dialog was not shown
  private _counts = new Map<string, string>(); // notification id -> its latest counted text
  private _recounting = new Set<string>(); // ids whose count waits for the toast to render
}
