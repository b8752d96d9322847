/**
 * The client's picture of the pool: GET me every few seconds (paused while the
 * browser tab is hidden), GET pool and GET pool/telemetry while an admin's
 * dashboard is shown, and the pushed kernel-action events, which trigger an
 * immediate refresh.
 */

import type { Event } from '@jupyterlab/services';
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import { PoolApiError, PoolClient } from './api';
import type { IKernelActionEvent, IMe, IPool, ITelemetry } from './types';
import { KERNEL_ACTION_SCHEMA } from './types';

export interface IPoolModelOptions {
  client: PoolClient;
  events?: Event.IManager;
  /** Milliseconds between two reads of GET me. */
  interval?: number;
}

/** Failed reads of GET me in a row after which the widgets say the pool cannot be reached. */
export const UNREACHABLE_AFTER = 2;

/** Seconds of readings the dashboard's plots show. */
export const TELEMETRY_WINDOW = 600;

export class PoolModel {
  constructor(options: IPoolModelOptions) {
    this.client = options.client;
    const interval = options.interval ?? 3000;
    this._mePoll = new Poll({
      auto: true,
      factory: () => this._readMe(),
      frequency: { interval, backoff: true, max: 60 * 1000 },
      name: 'jupyter-gpu-pool:me',
      standby: 'when-hidden'
    });
    this._poolPoll = new Poll({
      auto: false,
      factory: () => this._readPool(),
      frequency: { interval: interval * 2, backoff: true, max: 60 * 1000 },
      name: 'jupyter-gpu-pool:pool',
      standby: () => (this._poolWanted ? 'when-hidden' : true)
    });
    if (options.events) {
      options.events.stream.connect(this._onEvent, this);
    }
  }

  readonly client: PoolClient;

  /** The last GET me, or null before the first answer (or when there is no pool). */
  get me(): IMe | null {
    return this._me;
  }

  /** Why there is no `me`: the server's message, or null. */
  get error(): string | null {
    return this._error;
  }

  get pool(): IPool | null {
    return this._pool;
  }

  get telemetry(): ITelemetry | null {
    return this._telemetry;
  }

  get poolError(): string | null {
    return this._poolError;
  }

  /** Why the dashboard's plots have no readings, or null. */
  get telemetryError(): string | null {
    return this._telemetryError;
  }

  /**
   * Since when (server time) the server has not answered GET me, after UNREACHABLE_AFTER failed
   * reads in a row; null while it answers. `me` then is what it said last: the widgets grey it.
   */
  get unreachableSince(): number | null {
    return this._failures >= UNREACHABLE_AFTER ? this._lastAnswer : null;
  }

  /** The server's clock now, from the offset measured at the last read. */
  serverNow(): number {
    return Date.now() / 1000 + this._offset;
  }

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  get kernelEvent(): ISignal<this, IKernelActionEvent> {
    return this._kernelEvent;
  }

  /** Milliseconds between two reads of GET me (the dashboard's reads take twice as long). */
  set interval(ms: number) {
    this._mePoll.frequency = { ...this._mePoll.frequency, interval: ms };
    this._poolPoll.frequency = { ...this._poolPoll.frequency, interval: ms * 2 };
  }

  /** Read GET me now (after an action, or when an event says something changed). */
  refresh(): Promise<void> {
    return this._mePoll.refresh();
  }

  /** Read GET pool (and the telemetry) now, where the dashboard is shown. */
  refreshPool(): Promise<void> {
    return this._poolWanted ? this._poolPoll.refresh() : Promise.resolve();
  }

  /** Poll GET pool and its telemetry while the admin dashboard is shown. */
  set poolWanted(value: boolean) {
    if (value === this._poolWanted) {
      return;
    }
    this._poolWanted = value;
    if (value) {
      void this._poolPoll.start().then(() => this._poolPoll.refresh());
    } else {
      void this._poolPoll.stop();
    }
  }

  dispose(): void {
    this._mePoll.dispose();
    this._poolPoll.dispose();
    Signal.clearData(this);
  }

  private async _readMe(): Promise<void> {
    try {
      const me = await this.client.me();
      this._offset = me.now - Date.now() / 1000;
      this._me = me;
      this._error = null;
      this._failures = 0;
      this._lastAnswer = me.now;
    } catch (error) {
      this._failures += 1;
      if (error instanceof PoolApiError && error.status !== 0) {
        // The server answered: it has no pool for us (say why, keep polling slowly).
        this._me = null;
        this._error = error.message;
      } else {
        this._error = this._me ? this._error : String((error as Error).message ?? error);
      }
      this._changed.emit();
      throw error; // the Poll backs off
    }
    this._changed.emit();
  }

  private async _readPool(): Promise<void> {
    try {
      // The plots are a part of the dashboard: without readings it still shows the pool.
      const [pool, telemetry] = await Promise.all([
        this.client.pool(),
        this.client.telemetry(TELEMETRY_WINDOW).catch((error: Error) => error)
      ]);
      this._pool = pool;
      this._telemetry = telemetry instanceof Error ? null : telemetry;
      this._telemetryError = telemetry instanceof Error ? telemetry.message : null;
      this._poolError = null;
    } catch (error) {
      this._poolError = (error as Error).message;
      this._changed.emit();
      throw error;
    }
    this._changed.emit();
  }

  private _onEvent(_: unknown, emission: Event.Emission): void {
    if (emission.schema_id !== KERNEL_ACTION_SCHEMA) {
      return;
    }
    const event = emission as unknown as IKernelActionEvent;
    if (this._poolWanted) {
      void this._poolPoll.refresh(); // the admin's dashboard shows every user's kernels
    }
    if (this._me && event.user && event.user !== this._me.user) {
      return; // another user's kernel on a shared server: not ours to show
    }
    this._kernelEvent.emit(event);
    void this.refresh();
  }

  private _me: IMe | null = null;
  private _error: string | null = null;
  private _pool: IPool | null = null;
  private _telemetry: ITelemetry | null = null;
  private _poolError: string | null = null;
  private _telemetryError: string | null = null;
  private _offset = 0;
  private _failures = 0; // failed reads of GET me in a row
  private _lastAnswer: number | null = null; // server time of the last answer
  private _poolWanted = false;
  private _mePoll: Poll;
  private _poolPoll: Poll;
  private _changed = new Signal<this, void>(this);
  private _kernelEvent = new Signal<this, IKernelActionEvent>(this);
}
