/**
 * Resume before the cell runs: when the user opens or focuses a notebook whose kernel is
 * hibernated, or starts editing one of its cells, ask the server to wake the kernel now
 * (POST kernels/{id}/hint), so that the GPU slice is back by the time they press Shift+Enter.
 *
 * Only for kernels the UI knows are hibernated here (GET me says so and offers Resume), at most
 * one hint a kernel every few seconds, and none while the server asks to wait (429). The server
 * wakes a kernel only where a slice is free and nobody waits; whatever it answers, nothing is
 * announced: the kernel's card and the notebook's toolbar say "waking up…" while it resumes.
 */

import { PoolApiError } from './api';
import type { PoolModel } from './model';

/** Milliseconds between two hints for one kernel (typing in a cell sends one per keystroke). */
export const HINT_INTERVAL_MS = 5000;

export class Hints {
  constructor(
    private readonly _model: PoolModel,
    private readonly _interval = HINT_INTERVAL_MS,
    private readonly _clock: () => number = () => Date.now()
  ) {
    _model.changed.connect(this._retry, this);
  }

  /** How many hints were sent (for tests). */
  get sent(): number {
    return this._count;
  }

  /**
   * The user opened, focused or edited the notebook on this kernel: wake it if it sleeps here.
   * Before the first GET me, the notebook is remembered and the hint goes once the answer comes.
   */
  touch(kernelId: string | null | undefined): void {
    if (!kernelId) {
      return;
    }
    const me = this._model.me;
    if (!me) {
      this._pending = kernelId;
      return;
    }
    const kernel = me.kernels.find(k => k.kernel_id === kernelId);
    if (!kernel || kernel.state !== 'hibernated' || !kernel.actions.includes('resume')) {
      return;
    }
    const now = this._clock();
    if (now < this._pausedUntil || now - (this._last.get(kernelId) ?? -Infinity) < this._interval) {
      return;
    }
    this._last.set(kernelId, now);
    this._count += 1;
    this._model.client
      .hint(kernelId)
      .then(reply => {
        if (reply.woken) {
          void this._model.refresh(); // "waking up…" shows at once, not at the next poll
        }
      })
      .catch(error => {
        if (error instanceof PoolApiError && error.status === 429) {
          this._pausedUntil = this._clock() + (error.retryAfter ?? 60) * 1000;
        }
        // Otherwise a guess that did not work out: the cell resumes the kernel as it always did.
      });
  }

  private _retry(): void {
    if (this._pending && this._model.me) {
      const kernelId = this._pending;
      this._pending = null;
      this.touch(kernelId);
    }
  }

  private _last = new Map<string, number>();
  private _pending: string | null = null;
  private _pausedUntil = 0;
  private _count = 0;
}
