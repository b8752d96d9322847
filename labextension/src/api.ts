/**
 * The typed client of the server extension's REST API (docs/api.md).
 *
 * Reads carry `no_track_activity=1`, jupyter_server's own switch, on top of
 * the server extension not counting them: polling must never keep a server or
 * a kernel "active".
 */

import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { __ } from './i18n';
import type { AdminAction, CullAction, IKernel, IMe, IPool, ITelemetry } from './types';

export const API_PATH = 'gpu-pool/api/v1';

/** An answer other than 2xx: the server's `message` (written for the user) and `reason`. */
export class PoolApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly reason: string,
    /** Seconds the server asks to wait before the next try (its Retry-After), where it said. */
    readonly retryAfter: number | null = null
  ) {
    super(message);
  }
}

/** What a hint answered: whether the kernel is being woken, and if not, why. */
export interface IHintReply {
  kernel_id: string;
  woken: boolean;
  state: string;
  reason?: string;
  message: string;
}

/** What an action answered: what will be done, and whether this server does it or the kernel's own. */
export interface IActionReply {
  action: CullAction | AdminAction;
  kernel_id: string;
  /** True where the kernel runs in another server, which carries the action out at its next pass. */
  requested?: boolean;
}

export class PoolClient {
  constructor(readonly settings: ServerConnection.ISettings = ServerConnection.makeSettings()) {}

  me(): Promise<IMe> {
    return this._request<IMe>('me', { method: 'GET' }, {});
  }

  pool(): Promise<IPool> {
    return this._request<IPool>('pool', { method: 'GET' }, {});
  }

  /** Readings of the last `window` seconds (admins only). */
  telemetry(window: number): Promise<ITelemetry> {
    return this._request<ITelemetry>(
      'pool/telemetry',
      { method: 'GET' },
      { window: String(window) }
    );
  }

  snooze(kernelId: string, seconds?: number): Promise<IKernel> {
    const body = seconds === undefined ? {} : { seconds };
    return this._post<IKernel>(`kernels/${encodeURIComponent(kernelId)}/snooze`, body);
  }

  release(kernelId: string): Promise<IActionReply> {
    return this._post(`kernels/${encodeURIComponent(kernelId)}/release`, {});
  }

  resume(kernelId: string): Promise<IKernel> {
    return this._post<IKernel>(`kernels/${encodeURIComponent(kernelId)}/resume`, {});
  }

  /** The user opened or edited the notebook of this hibernated kernel: wake it if a slice is free now. */
  hint(kernelId: string): Promise<IHintReply> {
    return this._post<IHintReply>(`kernels/${encodeURIComponent(kernelId)}/hint`, {});
  }

  /** An admin's action on any lease (release, hibernate, shutdown). */
  act(kernelId: string, action: AdminAction): Promise<IActionReply> {
    return this._post(`kernels/${encodeURIComponent(kernelId)}/${action}`, {});
  }

  private _post<T>(path: string, body: unknown): Promise<T> {
    return this._request<T>(path, { method: 'POST', body: JSON.stringify(body) }, null);
  }

  /** `query` null: a write; an object: a read, with `no_track_activity=1` added. */
  private async _request<T>(
    path: string,
    init: RequestInit,
    query: Record<string, string> | null
  ): Promise<T> {
    let url = URLExt.join(this.settings.baseUrl, API_PATH, path);
    if (query !== null) {
      url += URLExt.objectToQueryString({ ...query, no_track_activity: '1' });
    }
    let response: Response;
    try {
      response = await ServerConnection.makeRequest(url, init, this.settings);
    } catch (error) {
      throw new PoolApiError(
        0,
        __('The Jupyter server cannot be reached: %1', String(error)),
        'network'
      );
    }
    let data: any = null;
    const text = await response.text();
    if (text) {
      try {
        data = JSON.parse(text);
      } catch {
        data = null;
      }
    }
    if (!response.ok) {
      const message =
        (data && typeof data.message === 'string' && data.message) ||
        (response.status === 404 && path === 'me'
          ? __('the jupyter-gpu-pool server extension is not enabled on this server')
          : `${response.status} ${response.statusText}`);
      const retry = Number(response.headers.get('Retry-After'));
      throw new PoolApiError(
        response.status,
        message,
        (data && data.reason) || 'http',
        Number.isFinite(retry) && retry > 0 ? retry : null
      );
    }
    return data as T;
  }
}
