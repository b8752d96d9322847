/**
 * The typed client of the server extension's REST API (docs/api.md).
 *
 * Reads carry `no_track_activity=1`, jupyter_server's own switch, on top of
 * the server extension not counting them: polling must never keep a server or
 * a kernel "active".
 */

import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import type { CullAction, IKernel, IMe, IPool } from './types';

export const API_PATH = 'gpu-pool/api/v1';

/** An answer other than 2xx: the server's `message` (written for the user) and `reason`. */
export class PoolApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly reason: string
  ) {
    super(message);
  }
}

export class PoolClient {
  constructor(readonly settings: ServerConnection.ISettings = ServerConnection.makeSettings()) {}

  me(): Promise<IMe> {
    return this._request<IMe>('me', { method: 'GET' }, true);
  }

  pool(): Promise<IPool> {
    return this._request<IPool>('pool', { method: 'GET' }, true);
  }

  snooze(kernelId: string, seconds?: number): Promise<IKernel> {
    const body = seconds === undefined ? {} : { seconds };
    return this._post<IKernel>(`kernels/${encodeURIComponent(kernelId)}/snooze`, body);
  }

  release(kernelId: string): Promise<{ action: CullAction }> {
    return this._post(`kernels/${encodeURIComponent(kernelId)}/release`, {});
  }

  resume(kernelId: string): Promise<IKernel> {
    return this._post<IKernel>(`kernels/${encodeURIComponent(kernelId)}/resume`, {});
  }

  private _post<T>(path: string, body: unknown): Promise<T> {
    return this._request<T>(path, { method: 'POST', body: JSON.stringify(body) }, false);
  }

  private async _request<T>(path: string, init: RequestInit, read: boolean): Promise<T> {
    let url = URLExt.join(this.settings.baseUrl, API_PATH, path);
    if (read) {
      url += '?no_track_activity=1';
    }
    let response: Response;
    try {
      response = await ServerConnection.makeRequest(url, init, this.settings);
    } catch (error) {
      throw new PoolApiError(0, `The Jupyter server cannot be reached: ${error}`, 'network');
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
          ? 'the jupyter-gpu-pool server extension is not enabled on this server'
          : `${response.status} ${response.statusText}`);
      throw new PoolApiError(response.status, message, (data && data.reason) || 'http');
    }
    return data as T;
  }
}
