/**
 * An admin's actions from the dashboard, until each is carried out or refused. Another user's kernel
 * is acted on by its own server at its next pass (the request goes by the pool's journal): without
 * this, the admin saw a note and then nothing. The lease's row says the request is under way until
 * the lease moves (carried out) or that server puts a refusal on record (a toast says why, and the
 * row until the lease moves). `outcome` is a pure function of GET pool.
 */

import type { INotes } from './actions';
import { formatClockSeconds } from './format';
import { __ } from './i18n';
import type { AdminAction, IPool } from './types';
import { sentence } from './words';

/** Seconds of clock difference within which a refusal on record answers a request. */
const CLOCK_SLACK = 2;

export interface IAdminRequest {
  kernelId: string;
  /** "bob’s bob-model.ipynb" */
  who: string;
  action: AdminAction;
  /** Server time the admin asked. */
  at: number;
  /** The lease's state and phase when asked: a change says it was carried out. */
  state: string;
  phase: string;
  /** Asked of another Jupyter server (its next pass). */
  elsewhere: boolean;
}

export type RequestOutcome =
  { kind: 'pending' } | { kind: 'refused'; message: string } | { kind: 'done' };

/** Where a request stands, by GET pool: refused on record, carried out (the lease moved), or pending. */
/** Whether the lease moved since the request: gone, or in another state or phase. */
function moved(request: IAdminRequest, pool: IPool): boolean {
  const lease = pool.leases.find(l => l.kernel_id === request.kernelId);
  return !lease || lease.state !== request.state || (lease.phase ?? '') !== request.phase;
}

export function outcome(request: IAdminRequest, pool: IPool): RequestOutcome {
  const refused = pool.decisions.find(
    d =>
      d.kind === 'refused' &&
      d.kernel_id === request.kernelId &&
      d.reason === 'admin' &&
      d.at >= request.at - CLOCK_SLACK
  );
  if (refused) {
    return { kind: 'refused', message: refused.message };
  }
  return moved(request, pool) ? { kind: 'done' } : { kind: 'pending' };
}

/** The request's name: "Release", "Hibernate", "Shut down". */
function actionLabel(action: AdminAction): string {
  switch (action) {
    case 'release':
      return __('Release');
    case 'hibernate':
      return __('Hibernate');
    default:
      return __('Shut down');
  }
}

/** What the lease's row says of a request. */
export function requestText(request: IAdminRequest, result: RequestOutcome): string {
  const at = formatClockSeconds(request.at);
  if (result.kind === 'refused') {
    return __(
      '%1 asked at %2, not carried out: %3',
      actionLabel(request.action),
      at,
      sentence(result.message || __('its server refused'))
    );
  }
  return request.elsewhere
    ? __(
        '%1 asked at %2: waiting for its own server, which acts at its next pass…',
        actionLabel(request.action),
        at
      )
    : __('%1 asked at %2: under way…', actionLabel(request.action), at);
}

/** The admin's requests of this page, followed with each GET pool. */
export class AdminRequests {
  constructor(private readonly _notes: INotes) {}

  add(request: IAdminRequest): void {
    this._requests.set(request.kernelId, { request, result: { kind: 'pending' } });
  }

  /** A fresh GET pool: carried out requests go; a refusal is told once, and stays on its row. */
  follow(pool: IPool): void {
    for (const [kernelId, entry] of this._requests) {
      if (entry.result.kind === 'refused') {
        if (moved(entry.request, pool)) {
          this._requests.delete(kernelId); // moved since: the refusal is history
        }
        continue;
      }
      const result = outcome(entry.request, pool);
      if (result.kind === 'done') {
        this._requests.delete(kernelId);
      } else if (result.kind === 'refused') {
        entry.result = result;
        this._notes.failed('', requestText(entry.request, result));
      }
    }
  }

  /** What the lease's row says, or null: nothing asked of it now. */
  view(kernelId: string): { text: string; pending: boolean } | null {
    const entry = this._requests.get(kernelId);
    return entry
      ? { text: requestText(entry.request, entry.result), pending: entry.result.kind === 'pending' }
      : null;
  }

  private _requests = new Map<string, { request: IAdminRequest; result: RequestOutcome }>();
}
