/**
 * Which notifications to show, from the polled state and the pushed events.
 *
 * A warning before a cull or hibernation (with Keep alive), an explanation
 * afterwards (what happened and why, instead of a bare "kernel died"), and a
 * refusal with what to do. The NoticeBook remembers what it has shown so that a
 * poll and an event about the same happening give one notification. No DOM
 * here: the plugin turns notices into JupyterLab notifications.
 */

import { baseName, formatClock, formatDuration, reasonPhrase } from './format';

export { reasonPhrase };
import type { IKernel, IKernelActionEvent, IMe, IRecent } from './types';

export type NoticeType = 'info' | 'success' | 'warning' | 'error';

export interface INotice {
  /** Identity of the notification: the same key is shown once. */
  key: string;
  kernelId: string;
  type: NoticeType;
  message: string;
  /** Offer a Keep alive button (snooze). */
  keepAlive: boolean;
  /** Offer a button that opens the GPU panel. */
  openPanel: boolean;
  autoClose: number | false;
  /** The kernel no longer exists (culled, or its process ended). */
  kernelGone: boolean;
}

export interface INoticeChanges {
  show: INotice[];
  /** Keys of shown notices that no longer apply (a warning snoozed or carried out). */
  dismiss: string[];
}

/** Happenings worth explaining, by the `kind` of a `recent` entry or the `action` of an event. */
const EXPLAINED = new Set([
  'culled',
  'hibernated',
  'refused',
  'over_memory',
  'released',
  'reclaimed',
  'resumed',
  'queued'
]);

/** Seconds within which a pushed event and a polled `recent` entry are the same happening. */
const SAME_HAPPENING = 120;

/** JupyterLab cuts a toast's message after this many characters. */
export const TOAST_LIMIT = 140;

const REFUSAL_ADVICE: Record<string, string> = {
  quota_exceeded: 'Release or shut down one of your GPU kernels, or pick a smaller GPU profile.',
  pool_exhausted: 'Try again soon, pick a smaller profile, or release a kernel you no longer need.',
  queue_timeout: 'Try again later or pick a smaller GPU profile.',
  mps: 'Pick a profile without an SM share, or ask your admin to start NVIDIA MPS.',
  config: 'Tell your admin: the GPU pool is misconfigured.'
};

/** What to do after a refused start. */
export function refusalAdvice(reason: string | undefined): string {
  return (reason && REFUSAL_ADVICE[reason]) || 'The GPU panel shows your quota and your kernels.';
}

/** A notebook's name short enough for a toast. */
export function shortName(name: string | undefined, fallback = 'A GPU kernel'): string {
  const base = name ? baseName(name) : '';
  if (!base) {
    return fallback;
  }
  return base.length > 32 ? `${base.slice(0, 31)}…` : base;
}

/** Within the toast's limit (the templates are written to fit; this is the guarantee). */
export function fit(text: string): string {
  return text.length > TOAST_LIMIT ? `${text.slice(0, TOAST_LIMIT - 1)}…` : text;
}

/** End with a full stop unless it already ends a sentence. */
export function sentence(text: string): string {
  const t = text.trim();
  return /[.!?…]$/.test(t) ? t : `${t}.`;
}

/** What happened and how to go on, in one toast: short sentences of our own, not the server's long message. */
export function explanation(kind: string, name: string | undefined, reason: string | undefined, message: string): string {
  const who = shortName(name);
  const why = reasonPhrase(reason);
  switch (kind) {
    case 'culled':
      return fit(`${who} was shut down to free its GPU slice (${why}). Start a kernel again to go on.`);
    case 'hibernated':
      return fit(`${who} hibernated (${why}); its variables are kept. Run a cell or Resume to go on.`);
    case 'refused':
      return fit(`A GPU kernel could not start: ${why}. ${refusalAdvice(reason)}`);
    case 'resumed':
      return `${who} resumed: it holds a GPU slice again.`;
    case 'queued':
      return `${who} waits for a GPU slice; it starts when one frees up (GPU panel shows its place).`;
    case 'reclaimed':
      return `${who}: its kernel process ended, so its GPU slice went back to the pool.`;
    case 'released':
      return fit(`${who} gave its GPU slice back (${why}).`);
    case 'over_memory':
      return `${who} uses more GPU memory than its slice: free some, or it will be shut down.`;
    default:
      return fit(sentence(`${who}: ${message || kind}`));
  }
}

function noticeType(kind: string): NoticeType {
  switch (kind) {
    case 'refused':
      return 'error';
    case 'culled':
    case 'over_memory':
      return 'warning';
    case 'resumed':
      return 'success';
    default:
      return 'info';
  }
}

/** The toast before a cull or hibernation. */
export function warningMessage(kernel: IKernel, now: number): string {
  const w = kernel.warning!;
  const who = shortName(kernel.name);
  const when = `at ${formatClock(w.deadline)} (in ${formatDuration(Math.max(0, w.deadline - now))})`;
  return fit(
    w.action === 'hibernate'
      ? `${who} hibernates ${when}: ${reasonPhrase(w.reason)}. It keeps its variables, not its GPU slice.`
      : `${who} shuts down ${when}: ${reasonPhrase(w.reason)}. Keep it alive to hold its GPU slice.`
  );
}

export class NoticeBook {
  /**
   * @param since - server time from which happenings are new; older `recent`
   *   entries were explained before this page was opened (the panel lists them).
   */
  constructor(since: number) {
    this._since = since;
  }

  /** Notices from a fresh GET me. */
  fromState(me: IMe): INoticeChanges {
    const show: INotice[] = [];
    const dismiss: string[] = [];
    const now = me.now;
    for (const kernel of me.kernels) {
      this._names.set(kernel.kernel_id, kernel.name);
    }
    // Warnings: one per pending action (a new deadline is a new warning).
    const current = new Map<string, string>();
    for (const kernel of me.kernels) {
      const w = kernel.warning;
      if (!w || w.deadline <= now) {
        continue;
      }
      const key = `warning:${kernel.kernel_id}:${Math.round(w.deadline)}`;
      current.set(kernel.kernel_id, key);
      if (!this._warnings.has(kernel.kernel_id) || this._warnings.get(kernel.kernel_id) !== key) {
        show.push({
          key,
          kernelId: kernel.kernel_id,
          type: 'warning',
          message: warningMessage(kernel, now),
          keepAlive: (kernel.actions ?? []).includes('snooze') && w.snoozes_left > 0,
          openPanel: true,
          autoClose: false,
          kernelGone: false
        });
      }
    }
    for (const [kernelId, key] of this._warnings) {
      if (current.get(kernelId) !== key) {
        dismiss.push(key);
      }
    }
    this._warnings = current;
    // Explanations of what happened since this page was opened.
    for (const entry of [...me.recent].sort((a, b) => a.at - b.at)) {
      const notice = this._fromRecent(entry);
      if (notice) {
        show.push(notice);
      }
    }
    return { show, dismiss };
  }

  /** Notices from a pushed kernel-action event (`now`: the server time it arrived). */
  fromEvent(event: IKernelActionEvent, now: number): INoticeChanges {
    const kind = event.action;
    if (!EXPLAINED.has(kind) || event.dry_run || event.reason === 'user') {
      return { show: [], dismiss: [] };
    }
    if (this._recentlyShown(kind, event.kernel_id, now)) {
      return { show: [], dismiss: [] };
    }
    this._remember(kind, event.kernel_id, now);
    const dismiss = this._dropWarning(event.kernel_id, kind);
    return {
      show: [this._explain(kind, event.kernel_id, this._names.get(event.kernel_id), event.message ?? '', event.reason, now)],
      dismiss
    };
  }

  private _fromRecent(entry: IRecent): INotice | null {
    if (entry.at <= this._since || !EXPLAINED.has(entry.kind) || entry.reason === 'user') {
      return null;
    }
    if (this._recentlyShown(entry.kind, entry.kernel_id, entry.at)) {
      return null;
    }
    this._remember(entry.kind, entry.kernel_id, entry.at);
    return this._explain(entry.kind, entry.kernel_id, entry.name || this._names.get(entry.kernel_id), entry.message, entry.reason, entry.at);
  }

  private _explain(
    kind: string,
    kernelId: string,
    name: string | undefined,
    message: string,
    reason: string | undefined,
    at: number
  ): INotice {
    const text = explanation(kind, name, reason, message);
    return {
      key: `${kind}:${kernelId}:${Math.round(at)}`,
      kernelId,
      type: noticeType(kind),
      message: text,
      keepAlive: false,
      openPanel: kind !== 'resumed',
      autoClose: kind === 'resumed' || kind === 'released' ? 5000 : false,
      kernelGone: kind === 'culled' || kind === 'reclaimed'
    };
  }

  private _dropWarning(kernelId: string, kind: string): string[] {
    const key = this._warnings.get(kernelId);
    if (key && kind !== 'queued') {
      this._warnings.delete(kernelId);
      return [key];
    }
    return [];
  }

  private _recentlyShown(kind: string, kernelId: string, at: number): boolean {
    const shown = this._shown.get(`${kind}:${kernelId}`);
    return shown !== undefined && Math.abs(shown - at) < SAME_HAPPENING;
  }

  private _remember(kind: string, kernelId: string, at: number): void {
    this._shown.set(`${kind}:${kernelId}`, at);
  }

  private _since: number;
  private _warnings = new Map<string, string>();
  private _shown = new Map<string, number>();
  private _names = new Map<string, string>();
}
