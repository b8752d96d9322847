/**
 * The open notebooks, as the GPU pool needs them: which one is current (for the
 * Kernel menu's commands), whether a cell of a notebook waits on its kernel,
 * and which notebook each kernel belonged to.
 *
 * After the pool shut a notebook's kernel down, JupyterLab would start a fresh
 * kernel silently at the next Shift+Enter (and the cell would fail on a name it
 * no longer knows). So the notebook stops starting kernels on its own until the
 * user starts one (its kernel preference's `shouldStart`), and a new kernel is
 * announced with what it lacks. Notebooks come from the document registry's
 * widget extension.
 */

import { ISessionContext, WidgetTracker } from '@jupyterlab/apputils';
import type { DocumentRegistry, DocumentWidget } from '@jupyterlab/docregistry';
import { ISignal, Signal } from '@lumino/signaling';

interface IKernelOf {
  widget: DocumentWidget;
  /** The kernelspec it was started from ("gpu-pool-gpu-10g"). */
  name: string;
}

/** A new kernel in a notebook whose kernel the pool had shut down. */
export interface IRestart {
  path: string;
  kernelId: string;
  /** The kernel it replaces. */
  replaces: string;
}

export class Notebooks {
  readonly tracker = new WidgetTracker<DocumentWidget>({ namespace: 'jupyter-gpu-pool-notebooks' });

  /** A cell started or finished waiting on a kernel (its connection's status changed). */
  get statusChanged(): ISignal<this, void> {
    return this._statusChanged;
  }

  /** A new kernel started in a notebook whose kernel the pool had shut down. */
  get restarted(): ISignal<this, IRestart> {
    return this._restarted;
  }

  /** A cell ran on a notebook's kernel (its kernel id). */
  get cellRan(): ISignal<this, string> {
    return this._cellRan;
  }

  /** Kernels whose notebook has another kernel now. */
  replaced(): ReadonlySet<string> {
    const found = new Set<string>();
    for (const [id, { widget }] of this._kernels) {
      const now = widget.context.sessionContext.session?.kernel?.id;
      if (now && now !== id) {
        found.add(id);
      }
    }
    return found;
  }

  /** Kernels on which a cell ran in this page. */
  ran(): ReadonlySet<string> {
    return this._ran;
  }

  /** Follow a notebook's kernels from now on. */
  add(widget: DocumentWidget, context: DocumentRegistry.IContext<DocumentRegistry.IModel>): void {
    void this.tracker.add(widget);
    const session = context.sessionContext;
    const remember = () => {
      const kernel = session.session?.kernel;
      if (!kernel) {
        return;
      }
      this._kernels.set(kernel.id, { widget, name: kernel.name });
      const before = this._gone.get(widget);
      if (before && before.kernelId !== kernel.id) {
        // A kernel again, started by the user: the notebook may start its own kernels again.
        this._gone.delete(widget);
        session.kernelPreference = before.preference;
        this._restarted.emit({
          path: context.path,
          kernelId: kernel.id,
          replaces: before.kernelId
        });
      }
    };
    session.kernelChanged.connect(remember);
    session.statusChanged.connect(() => this._statusChanged.emit());
    session.iopubMessage.connect((_, message) => {
      const kernel = session.session?.kernel;
      if (message.header.msg_type === 'execute_input' && kernel && !this._ran.has(kernel.id)) {
        this._ran.add(kernel.id);
        this._cellRan.emit(kernel.id);
      }
    });
    session.ready.then(remember).catch(() => undefined);
    widget.disposed.connect(() => {
      for (const [id, found] of this._kernels) {
        if (found.widget === widget) {
          this._kernels.delete(id);
        }
      }
    });
  }

  /** The kernel id of the current notebook (the one the user last worked in), or null. */
  currentKernelId(): string | null {
    return this.tracker.currentWidget?.context.sessionContext.session?.kernel?.id ?? null;
  }

  /** Whether a notebook is open for the kernel with this id (alive or not). */
  has(kernelId: string): boolean {
    return this._kernels.has(kernelId);
  }

  /** Whether a cell of the notebook on this kernel waits on it (the connection says busy). */
  busy(kernelId: string): boolean {
    const found = this._kernels.get(kernelId);
    const session = found?.widget.context.sessionContext;
    return (
      !!session &&
      session.session?.kernel?.id === kernelId &&
      session.kernelDisplayStatus === 'busy'
    );
  }

  /**
   * The pool shut this kernel down: its notebook must not start a fresh kernel behind the user's
   * back at the next Shift+Enter (JupyterLab asks which kernel to start instead).
   */
  markGone(kernelId: string): void {
    const found = this._kernels.get(kernelId);
    if (!found || found.widget.isDisposed || this._gone.has(found.widget)) {
      return;
    }
    const session = found.widget.context.sessionContext;
    if (session.session?.kernel && session.session.kernel.id !== kernelId) {
      return; // it has another kernel already
    }
    this._gone.set(found.widget, { kernelId, preference: session.kernelPreference });
    session.kernelPreference = {
      ...session.kernelPreference,
      shouldStart: false,
      autoStartDefault: false
    };
  }

  /**
   * Start a new kernel of the same kind in the notebook whose kernel this was, and show it.
   * False when that notebook is closed.
   */
  async startNewKernel(kernelId: string, activate: (id: string) => void): Promise<boolean> {
    const found = this._kernels.get(kernelId);
    if (!found || found.widget.isDisposed) {
      return false;
    }
    activate(found.widget.id);
    await found.widget.context.sessionContext.changeKernel({ name: found.name });
    return true;
  }

  private _kernels = new Map<string, IKernelOf>();
  private _gone = new Map<
    DocumentWidget,
    { kernelId: string; preference: ISessionContext.IKernelPreference }
  >();
  private _ran = new Set<string>();
  private _statusChanged = new Signal<this, void>(this);
  private _restarted = new Signal<this, IRestart>(this);
  private _cellRan = new Signal<this, string>(this);
}
