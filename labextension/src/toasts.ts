/**
 * The pool's notifications in JupyterLab: facts.ts says which hold now and which of them are toasts;
 * this keeps JupyterLab's notifications equal to that, with their buttons (Keep alive, Release now,
 * Start a new kernel, Run all cells, Open GPU panel). A toast whose fact stops holding leaves the
 * screen at once and leaves its record in the notification centre (a warning leaves nothing: what
 * happened at its deadline is a record of its own). At most three toasts are on the page at any
 * moment, one leaving included: a toast waits for room. Muted (a setting), nothing is shown: the
 * status bar and the panel still say everything.
 */

import type { JupyterFrontEnd } from '@jupyterlab/application';
import { Notification } from '@jupyterlab/apputils';

import { keepAlive, release } from './actions';
import type { INotes } from './actions';
import { factsNow, IFact, MAX_ON_SCREEN, NoticeBook, placeToasts } from './facts';
import { __ } from './i18n';
import type { PoolModel } from './model';
import type { Notebooks } from './notebooks';
import { fit } from './notices';

/** Milliseconds a toast just emitted counts as on the page before JupyterLab has rendered it. */
const RENDER_MS = 2000;

/** Milliseconds between two looks while a toast waits for room or for its rendering. */
const RETRY_MS = 150;

/** One of our notifications. */
interface IShown {
  id: string;
  key: string;
  members: string[];
  message: string;
  /** Shown as a toast (not only in the notification centre). */
  toast: boolean;
  /** When it was emitted (Date.now()). */
  at: number;
  rendered: boolean;
}

/** The data of our notifications: the fact each stands for (the browser tests read it too). */
export interface IFactData {
  gpuPoolFact: string;
  gpuPoolKernel: string;
}

export class Toasts implements INotes {
  constructor(
    private readonly _app: JupyterFrontEnd,
    private readonly _model: PoolModel,
    private readonly _notebooks: Notebooks,
    private readonly _openPanel: () => void
  ) {
    _model.changed.connect(() => {
      const me = _model.me;
      if (me) {
        this._book(me.now).fromState(me);
        this._sync();
      }
    });
    _model.kernelEvent.connect((_, event) => {
      this._book().fromEvent(event, _model.serverNow());
      this._sync();
    });
    _notebooks.restarted.connect((_, restart) => {
      this._book().add('new_kernel', {
        kernelId: restart.kernelId,
        replaces: restart.replaces,
        name: restart.path,
        at: _model.serverNow()
      });
      this._sync();
    });
    _notebooks.cellRan.connect(() => this._sync());
    Notification.manager.changed.connect((_, change) => {
      if (change.type === 'removed') {
        this._removed(change.notification.id);
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
    this._add('kernel_error', '', fit(__('A kernel could not start: %1', message.trim())));
  }

  /** The user's own action failed (a refusal of it): a toast while its kernel is as it was. */
  failed(kernelId: string, message: string): void {
    this._add('action_failed', kernelId, fit(message));
  }

  /** What an action of the user's did: the notification centre keeps it, no toast. */
  note(kernelId: string, message: string): void {
    this._add('note', kernelId, fit(message));
  }

  private _add(kind: 'kernel_error' | 'action_failed' | 'note', kernelId: string, message: string) {
    this._book().add(kind, { kernelId, message, at: this._model.serverNow() });
    this._sync();
  }

  private _book(since?: number): NoticeBook {
    if (!this._notices) {
      this._notices = new NoticeBook(since ?? this._model.serverNow());
    }
    return this._notices;
  }

  /** Make JupyterLab's notifications what the facts say now. */
  private _sync(): void {
    if (!this._notices) {
      return;
    }
    const facts = factsNow({
      me: this._notices.me,
      happenings: this._notices.happenings,
      replaced: this._notebooks.replaced(),
      ran: this._notebooks.ran(),
      closed: this._closed,
      ended: this._recorded
    });
    this._markGone(facts);
    if (this.muted) {
      // Nothing shown, and not later either: what holds while muted is over for the page.
      facts.forEach(fact => fact.members.forEach(key => this._closed.add(key)));
      return;
    }
    const placed = placeToasts(facts, this._placed, this._demoted);
    placed.demoted.forEach(key => this._demoted.add(key));
    this._placed = placed.onScreen;
    const byKey = new Map(facts.map(f => [f.key, f]));
    let waiting = false;
    for (const shown of [...this._shown.values()]) {
      if (this._rendering(shown)) {
        waiting = true; // changed once JupyterLab has drawn it: an update before would be lost
        continue;
      }
      this._follow(shown, byKey.get(shown.key), placed.onScreen.includes(shown.key));
    }
    let room = MAX_ON_SCREEN - this._onPage();
    for (const fact of facts) {
      if (this._shown.has(fact.key) || this._recorded.has(fact.key)) {
        continue;
      }
      if (fact.nature === 'record') {
        this._emit(fact, fact.record ?? fact.message, false);
        fact.members.forEach(key => this._recorded.add(key));
      } else if (!placed.onScreen.includes(fact.key)) {
        this._emit(fact, fact.message, false);
      } else if (room > 0) {
        this._emit(fact, fact.message, true);
        room--;
      } else {
        waiting = true; // a toast leaving still takes its place on the page
      }
    }
    this._mark();
    if (waiting || [...this._shown.values()].some(s => this._rendering(s))) {
      this._soon();
    }
  }

  /**
   * A kernel the server ended: JupyterLab learns of it only at its next poll; ask now, so that the
   * notebook says "No Kernel" instead of a stale "Idle", and starts no fresh kernel behind the
   * user's back (Notebooks.markGone).
   */
  private _markGone(facts: IFact[]): void {
    for (const fact of facts) {
      if (fact.nature === 'loss' && !this._gone.has(fact.kernelId)) {
        this._gone.add(fact.kernelId);
        this._notebooks.markGone(fact.kernelId);
        void this._app.serviceManager.sessions.refreshRunning();
        void this._app.serviceManager.kernels.refreshRunning();
      }
    }
  }

  /** Bring one of our notifications in line with its fact (none: it no longer holds). */
  private _follow(shown: IShown, fact: IFact | undefined, onScreen: boolean): void {
    if (!fact) {
      this._remove(shown);
      return;
    }
    if (fact.nature === 'record') {
      // Its fact no longer holds: off the screen, its record stays in the notification centre.
      this._update(
        shown,
        { message: fact.record ?? fact.message, actions: [], type: 'info' },
        true
      );
      this._shown.delete(shown.key);
      [shown.key, ...shown.members, ...fact.members].forEach(key => this._recorded.add(key));
      return;
    }
    shown.members = fact.members;
    if (shown.toast && !onScreen) {
      this._update(shown, { message: fact.message }, true); // to the centre, for a newer warning
      shown.toast = false;
    } else if (shown.message !== fact.message) {
      this._update(shown, { message: fact.message }, false); // a count, or fresher advice
    }
    shown.message = fact.message;
  }

  /**
   * Change a notification; `leave`: take its toast off the screen (an update that closes it at once;
   * it stays in the centre). One already off the screen is updated there only (autoClose 0).
   */
  private _update(
    shown: IShown,
    change: { message: string; actions?: Notification.IAction[]; type?: Notification.TypeOptions },
    leave: boolean
  ): void {
    const onPage = shown.toast && document.getElementById(shown.id) !== null;
    Notification.update({
      id: shown.id,
      ...change,
      autoClose: onPage ? (leave ? 1 : undefined) : 0
    });
  }

  private _remove(shown: IShown): void {
    this._removing.add(shown.id);
    Notification.dismiss(shown.id);
    this._removing.delete(shown.id);
    this._shown.delete(shown.key);
  }

  /** A notification of ours removed by the user (closed, or a button pressed): never again. */
  private _removed(id: string): void {
    if (this._removing.has(id)) {
      return;
    }
    for (const shown of this._shown.values()) {
      if (shown.id === id) {
        shown.members.forEach(key => this._closed.add(key));
        this._closed.add(shown.key);
        this._shown.delete(shown.key);
        this._sync();
        return;
      }
    }
  }

  /** A toast emitted a moment ago that JupyterLab has not drawn yet. */
  private _rendering(shown: IShown): boolean {
    if (!shown.toast || shown.rendered) {
      return false;
    }
    if (document.getElementById(shown.id) !== null) {
      shown.rendered = true;
      return false;
    }
    return Date.now() - shown.at < RENDER_MS;
  }

  /** Our toasts on the page now: drawn (one leaving too), or meant to be (emitted a moment ago). */
  private _onPage(): number {
    const drawn = [...document.querySelectorAll('.Toastify__toast-container .Toastify__toast')]
      .map(el => el.id)
      .filter(id => this._ids.has(id));
    const meant = [...this._shown.values()].filter(s => s.toast).map(s => s.id);
    return new Set([...drawn, ...meant]).size;
  }

  /** Each drawn toast says which fact it stands for (data-gpu-pool-fact), for tests and tools. */
  private _mark(): void {
    for (const shown of this._shown.values()) {
      const el = shown.toast ? document.getElementById(shown.id) : null;
      if (el && el.dataset.gpuPoolFact !== shown.key) {
        el.dataset.gpuPoolFact = shown.key;
      }
    }
  }

  private _soon(): void {
    if (this._timer === null) {
      this._timer = window.setTimeout(() => {
        this._timer = null;
        this._sync();
      }, RETRY_MS);
    }
  }

  private _emit(fact: IFact, message: string, toast: boolean): void {
    const data: IFactData = { gpuPoolFact: fact.key, gpuPoolKernel: fact.kernelId };
    const record = fact.nature === 'record';
    const id = Notification.emit(message, record ? 'info' : fact.type, {
      // autoClose 0: JupyterLab puts the notification in its centre and shows no toast.
      autoClose: toast ? false : 0,
      actions: record ? [] : this._buttons(fact),
      data: { ...data }
    });
    this._ids.add(id);
    if (!record) {
      this._shown.set(fact.key, {
        id,
        key: fact.key,
        members: fact.members,
        message,
        toast,
        at: Date.now(),
        rendered: false
      });
    }
  }

  private _buttons(fact: IFact): Notification.IAction[] {
    const buttons: Notification.IAction[] = [];
    const kernelId = fact.kernelId;
    if (fact.keepAlive) {
      buttons.push({
        label: __('Keep alive'),
        caption: __('Postpone this action: the kernel keeps its GPU slice'),
        displayType: 'accent',
        callback: () => void keepAlive(this._model, kernelId, this)
      });
    }
    if (fact.release) {
      buttons.push({
        label: __('Release now'),
        caption: __('Give the GPU slice back now, for whoever waits for one'),
        displayType: 'default',
        callback: () => {
          const name = this._model.me?.kernels.find(k => k.kernel_id === kernelId)?.name ?? '';
          void release(this._model, { kernel_id: kernelId, name }, this);
        }
      });
    }
    if (fact.newKernel && this._notebooks.has(kernelId)) {
      buttons.push({
        label: __('Start a new kernel'),
        caption: __('A fresh kernel of the same kind: run your cells again, top to bottom'),
        displayType: 'accent',
        callback: () =>
          void this._notebooks.startNewKernel(kernelId, id => this._app.shell.activateById(id))
      });
    }
    if (fact.runAll) {
      buttons.push({
        label: __('Run all cells'),
        displayType: 'accent',
        callback: () => void this._app.commands.execute('notebook:run-all-cells')
      });
    }
    if (fact.openPanel || fact.newKernel) {
      buttons.push({
        label: __('Open GPU panel'),
        displayType: 'link',
        callback: event => {
          event.preventDefault(); // the toast stays: the panel says the same, at length
          this._openPanel();
        }
      });
    }
    return buttons;
  }

  private _notices: NoticeBook | null = null;
  private _shown = new Map<string, IShown>(); // fact key -> its notification (not a record)
  private _ids = new Set<string>(); // every notification id of ours
  private _recorded = new Set<string>(); // keys whose record is in the centre
  private _closed = new Set<string>(); // happening keys the user closed: never again
  private _demoted = new Set<string>(); // live facts sent to the centre: never a toast again
  private _placed: string[] = []; // the facts on screen, by the last placement
  private _removing = new Set<string>(); // ids we dismiss ourselves
  private _gone = new Set<string>(); // kernels marked gone in their notebooks
  private _timer: number | null = null;
}
