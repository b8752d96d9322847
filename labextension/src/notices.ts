/**
 * Which notifications to show, from the polled state and the pushed events.
 *
 * A warning before a cull or hibernation (what the user loses and what they can
 * still do), an explanation afterwards (what happened and why, instead of a bare
 * "kernel died"), and a refusal with advice that fits the limit hit. The
 * NoticeBook remembers what it has shown so that a poll and an event about the
 * same happening give one notification. No DOM here: the plugin turns notices
 * into JupyterLab notifications.
 */

import { baseName, formatClock, formatDuration, kindWord, reasonPhrase } from './format';
import { __ } from './i18n';
import type { IKernel, IKernelActionEvent, IMe, IRecent } from './types';
import { canKeepAlive, declaredNote, onMps, pendingWarning } from './view';

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
  /** Offer "Start a new kernel" for the notebook whose kernel is gone. */
  newKernel: boolean;
  /** Offer "Release now": give the slice back at once to whoever waits for one. */
  release?: boolean;
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

/**
 * Reasons never worth a toast: the user's own request, a kernel woken in advance as its notebook
 * was opened, or put back to sleep when no cell came (shown calmly on its card: "waking up…"), and
 * a kernel asleep between cells by its rule (it lost nothing; its card says a cell wakes it).
 */
const QUIET_REASONS = new Set(['user', 'hint', 'hint_unused', 'after_cell']);

/** Seconds within which a pushed event and a polled `recent` entry are the same happening. */
const SAME_HAPPENING = 120;

/** JupyterLab cuts a toast's message after this many characters. */
export const TOAST_LIMIT = 140;

/** A notebook's name short enough for a toast. */
export function shortName(name: string | undefined | null, fallback?: string): string {
  const base = name ? baseName(name) : '';
  if (!base) {
    return fallback ?? __('A GPU kernel');
  }
  return base.length > 28 ? `${base.slice(0, 27)}…` : base;
}

/** "gpu-demo.ipynb’s kernel": it is the kernel that goes, not the notebook. */
export function kernelOf(name: string | undefined | null): string {
  const short = shortName(name, '');
  return short ? __('%1’s kernel', short) : __('A GPU kernel');
}

/** Within the toast's limit (the templates are written to fit; this is the guarantee). */
export function fit(text: string): string {
  return text.length > TOAST_LIMIT ? `${text.slice(0, TOAST_LIMIT - 1)}…` : text;
}

/** The first (fullest) wording that fits the toast; the last one is written to fit a long name. */
export function fitting(...wordings: string[]): string {
  return wordings.find(w => w.length <= TOAST_LIMIT) ?? fit(wordings[wordings.length - 1]);
}

/** The launcher name of a profile id, from GET me's profiles. */
function launcherName(me: IMe | null, profile: string | undefined): string {
  const found = me?.profiles?.find(p => p.name === profile);
  return found?.launcher_name ?? (profile ? profile : __('A GPU kernel'));
}

/**
 * What to do after a refused start, fitted to the limit hit: a kernel-count quota is helped only
 * by shutting one down; a memory quota or a full pool by what would start now; a pool without
 * GPUs only by the admin.
 */
export function refusalAdvice(
  reason: string | undefined,
  me: IMe | null,
  profile?: string
): string {
  const fits = (me?.profiles ?? [])
    .filter(p => p.starts_now && p.name !== profile)
    .map(p => p.launcher_name);
  const wouldStart =
    fits.length > 1
      ? __('‘%1’ or ‘%2’ would start now.', fits[0], fits[1])
      : fits.length
        ? __('‘%1’ would start now.', fits[0])
        : '';
  switch (reason) {
    case 'quota_exceeded': {
      if (me && me.quota.kernels !== null && me.usage.kernels >= me.quota.kernels) {
        return __(
          'You hold %1 of %2 GPU kernels: shut one down first.',
          me.usage.kernels,
          me.quota.kernels
        );
      }
      return wouldStart || __('Shut a GPU kernel down to make room in your quota.');
    }
    case 'pool_exhausted':
      if (me && me.pool.gpus === 0) {
        return __('The pool has no GPUs: tell your admin.');
      }
      return wouldStart || __('Try again when an idle kernel gives its slice back.');
    case 'queue_timeout':
      return wouldStart || __('No slice freed up in time: try again later.');
    case 'budget_exceeded':
      return __('Save your work; your GPU time resets with the next period.');
    case 'mps':
    case 'mps_user_busy':
      return __('Pick a profile without an SM share.');
    case 'config':
      return __('Tell your admin: the GPU pool is misconfigured.');
    default:
      return __('The GPU panel shows your quota and your kernels.');
  }
}

/** What happened and how to go on, in one toast: short sentences of our own, not the server's long message. */
export function explanation(
  kind: string,
  name: string | undefined,
  reason: string | undefined,
  message: string,
  context: {
    me?: IMe | null;
    profile?: string;
    declared?: boolean;
    action?: string;
    /** It ended because its server stopped. */
    withServer?: boolean;
  } = {}
): string {
  const who = kernelOf(name);
  const why = reasonPhrase(reason);
  switch (kind) {
    case 'culled':
      return fitting(
        __(
          '%1 was shut down (%2): its variables are gone. Start a new kernel and run your cells again.',
          who,
          why
        ),
        __('%1 was shut down (%2): its variables are gone. Start a new kernel.', who, why),
        __('%1 was shut down: its variables are gone. Start a new kernel.', who)
      );
    case 'hibernated': {
      const declared = context.declared ? ` (${declaredNote()})` : '';
      return fitting(
        __(
          '%1 hibernated (%2): its variables are kept%3. Run a cell to resume it.',
          who,
          why,
          declared
        ),
        __('%1 hibernated: its variables are kept%2. Run a cell to resume it.', who, declared),
        __('%1 hibernated: its variables are kept. Run a cell to resume it.', who)
      );
    }
    case 'refused':
      if (reason === 'hibernation_failed') {
        // A move of its GPU memory failed; the event does not say which, nor whether the kernel kept running
        // (a failed hibernation the pool ordered keeps it running; a failed Release shuts it down): the
        // panel's "What happened" says, in the server's words.
        return fitting(
          __(
            '%1: a hibernation or resume failed. The GPU panel’s “What happened” says whether it kept running, and what to do.',
            who
          ),
          __('%1: a hibernation or resume failed; the GPU panel says what happened.', who)
        );
      }
      if (context.action === 'resume') {
        return fit(__('%1 could not resume: %2. Its variables are kept.', who, why));
      }
      if (context.action === 'first_cell') {
        return fit(__('%1 could not take its GPU slice, so its cell did not run: %2.', who, why));
      }
      if (context.action === 'hibernate') {
        return fit(__('%1 did not hibernate now (%2); it keeps running.', who, why));
      }
      return fitting(
        __(
          '‘%1’ could not start: %2. %3',
          launcherName(context.me ?? null, context.profile),
          why,
          refusalAdvice(reason, context.me ?? null, context.profile)
        ),
        __(
          '‘%1’ could not start: %2. The GPU panel says why.',
          launcherName(context.me ?? null, context.profile),
          why
        )
      );
    case 'resumed':
      return fit(__('%1 resumed: it holds a GPU slice again.', who));
    case 'queued':
      return fit(
        __(
          '%1 waits for a GPU slice; it goes on when one frees up (the GPU panel shows its place).',
          who
        )
      );
    case 'reclaimed':
      return context.withServer
        ? fit(__('%1 ended when the server stopped: its variables are gone.', who))
        : fit(__('%1 ended, so its GPU slice went back to the pool.', who));
    case 'released':
      if (context.withServer) {
        return fit(__('%1 ended when the server stopped: its variables are gone.', who));
      }
      return context.action === 'hibernate'
        ? fit(__('%1 gave its GPU slice back; its variables are kept.', who))
        : fitting(
            __(
              '%1 was shut down to give its GPU slice back (%2): its variables are gone.',
              who,
              why
            ),
            __('%1 was shut down (%2): its variables are gone.', who, why)
          );
    case 'over_memory':
      return fit(
        __('%1 uses more GPU memory than its slice: free some, or it will be shut down.', who)
      );
    default: {
      const text = __('%1: %2', shortName(name), message || kindWord(kind)).trim();
      return fit(/[.!?…]$/.test(text) ? text : `${text}.`);
    }
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

/**
 * The toast before a cull or hibernation: whose kernel, an absolute time (a toast does not tick),
 * what is lost or kept, and what the user can still do (Keep alive only while snoozes are left).
 */
export function warningMessage(kernel: IKernel, now?: number): string {
  const w = kernel.warning!;
  const who = kernelOf(kernel.name);
  const at = formatClock(w.deadline);
  if (w.reason === 'pressure') {
    return pressureMessage(kernel, who, at, now);
  }
  if (w.reason === 'over_memory') {
    return fit(
      __(
        '%1 shuts down at %2: it uses more GPU memory than its slice. Free some to keep it.',
        who,
        at
      )
    );
  }
  if (w.reason === 'budget') {
    return fit(__('%1 gives its GPU back at %2: your GPU time runs out. Save your work.', who, at));
  }
  const why = reasonPhrase(w.reason);
  if (w.action === 'hibernate') {
    return canKeepAlive(kernel)
      ? fitting(
          __(
            '%1 hibernates at %2 (%3): variables kept, slice given back. Run a cell or Keep alive to keep it.',
            who,
            at,
            why
          ),
          __(
            '%1 hibernates at %2: variables kept, slice given back. Run a cell or Keep alive to keep it.',
            who,
            at
          )
        )
      : fitting(
          __(
            '%1 hibernates at %2 (%3): variables kept, slice given back. Run a cell to keep it.',
            who,
            at,
            why
          ),
          __(
            '%1 hibernates at %2: variables kept, slice given back. Run a cell to keep it.',
            who,
            at
          )
        );
  }
  if (onMps(kernel)) {
    // It would hibernate if it could (an MPS slice cannot): say so, the loss is the surprise.
    return canKeepAlive(kernel)
      ? fitting(
          __(
            '%1 shuts down at %2 (%3): it cannot hibernate, its variables will be lost. Run a cell or Keep alive.',
            who,
            at,
            why
          ),
          __(
            '%1 shuts down at %2: it cannot hibernate, its variables will be lost. Run a cell or Keep alive.',
            who,
            at
          )
        )
      : fitting(
          __(
            '%1 shuts down at %2 (%3): it cannot hibernate, its variables will be lost. Run a cell or save your work.',
            who,
            at,
            why
          ),
          __(
            '%1 shuts down at %2: it cannot hibernate, its variables will be lost. Save your work.',
            who,
            at
          )
        );
  }
  return canKeepAlive(kernel)
    ? fitting(
        __(
          '%1 shuts down at %2 (%3): its variables will be lost. Run a cell or Keep alive to keep it.',
          who,
          at,
          why
        ),
        __(
          '%1 shuts down at %2: its variables will be lost. Run a cell or Keep alive to keep it.',
          who,
          at
        )
      )
    : fitting(
        __(
          '%1 shuts down at %2 (%3): its variables will be lost. Run a cell to keep it, or save your work.',
          who,
          at,
          why
        ),
        __(
          '%1 shuts down at %2: its variables will be lost. Run a cell to keep it, or save your work.',
          who,
          at
        )
      );
}

/**
 * The toast of a kernel chosen to give its slice to someone waiting in the queue: why this kernel (idle
 * that long), why now (someone waits), when, what it keeps, and what to do (its buttons: Keep alive
 * while snoozes are left, Release now).
 */
function pressureMessage(kernel: IKernel, who: string, at: string, now?: number): string {
  const idle =
    kernel.idle_since && now !== undefined ? formatDuration(now - kernel.idle_since) : '';
  const wordings =
    kernel.warning!.action === 'hibernate'
      ? [
          __(
            '%1 has been idle for %2 and someone waits for a GPU: it hibernates at %3, variables kept. Run a cell to keep it.',
            who,
            idle,
            at
          ),
          __(
            '%1, idle %2, hibernates at %3 for someone waiting for a GPU; variables kept. Run a cell to keep it.',
            who,
            idle,
            at
          )
        ]
      : [
          __(
            '%1 has been idle for %2 and someone waits for a GPU: it shuts down at %3, variables lost. Run a cell to keep it.',
            who,
            idle,
            at
          ),
          __(
            '%1, idle %2, shuts down at %3 for someone waiting for a GPU; variables lost. Run a cell to keep it.',
            who,
            idle,
            at
          )
        ];
  const last =
    kernel.warning!.action === 'hibernate'
      ? __(
          '%1 hibernates at %2 for someone waiting for a GPU; variables kept. Run a cell to keep it.',
          who,
          at
        )
      : __(
          '%1 shuts down at %2 for someone waiting for a GPU; its variables will be lost. Run a cell to keep it.',
          who,
          at
        );
  return idle ? fitting(...wordings, last) : fitting(last);
}

/** At most this many of the pool's toasts on screen; older ones stay in the notification centre. */
export const MAX_ON_SCREEN = 3;

/**
 * Which of the shown toasts (oldest first) to take off the screen so that at most `max` stay:
 * the oldest, except warnings (a pending action the user can still stop), which go last.
 */
export function toHide(
  onScreen: ReadonlyArray<{ id: string; warning: boolean }>,
  max = MAX_ON_SCREEN
): string[] {
  const excess = onScreen.length - max;
  if (excess <= 0) {
    return [];
  }
  const order = [...onScreen.filter(t => !t.warning), ...onScreen.filter(t => t.warning)];
  return order.slice(0, excess).map(t => t.id);
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
    this._me = me;
    const show: INotice[] = [];
    const dismiss: string[] = [];
    const now = me.now;
    for (const kernel of me.kernels) {
      this._names.set(kernel.kernel_id, kernel.name);
    }
    // Warnings: one per pending action (a new deadline, or no Keep alive left, is a new warning).
    const current = new Map<string, string>();
    for (const kernel of me.kernels) {
      const w = pendingWarning(kernel);
      if (!w || w.deadline <= now) {
        continue;
      }
      const keepAlive = canKeepAlive(kernel);
      const key = `warning:${kernel.kernel_id}:${Math.round(w.deadline)}:${keepAlive ? 'k' : 'n'}`;
      current.set(kernel.kernel_id, key);
      if (this._warnings.get(kernel.kernel_id) !== key) {
        show.push({
          key,
          kernelId: kernel.kernel_id,
          type: 'warning',
          message: warningMessage(kernel, now),
          keepAlive,
          openPanel: true,
          newKernel: false,
          release: w.reason === 'pressure' && (kernel.actions ?? []).includes('release'),
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
    dismiss.push(...this._staleRefusals(me));
    // Explanations of what happened since this page was opened.
    // A kernel woken on a hint: the ledger's entry of its resume comes before the server's own (which
    // says it was a hint), and it is no news either way.  Nor is the wake of a kernel asleep between cells.
    const waking = new Set(me.kernels.filter(k => k.woken_on_hint).map(k => k.kernel_id));
    for (const entry of [...me.recent].sort((a, b) => a.at - b.at)) {
      if (
        entry.kind === 'resumed' &&
        (waking.has(entry.kernel_id) || this._betweenCells(entry.kernel_id))
      ) {
        continue;
      }
      const notice = this._fromRecent(entry);
      if (notice) {
        show.push(notice);
        dismiss.push(...this._supersede(notice));
      }
    }
    return { show, dismiss };
  }

  /** Notices from a pushed kernel-action event (`now`: the server time it arrived). */
  fromEvent(event: IKernelActionEvent, now: number): INoticeChanges {
    const kind = event.action;
    if (!EXPLAINED.has(kind) || event.dry_run || QUIET_REASONS.has(event.reason ?? '')) {
      return { show: [], dismiss: [] };
    }
    if (kind === 'resumed' && this._betweenCells(event.kernel_id)) {
      return { show: [], dismiss: [] };
    }
    // A refusal's advice (what would start now) is read from GET me: one older than the refusal would give
    // advice the next GET me withdraws at once. The refresh this event triggers brings the refusal in
    // `recent`, explained then, from a picture taken after it.
    if (kind === 'refused' && this._me !== null && this._me.now < now) {
      return { show: [], dismiss: [] };
    }
    if (this._recentlyShown(kind, event.kernel_id, now)) {
      return { show: [], dismiss: [] };
    }
    this._remember(kind, event.kernel_id, now);
    const notice = this._explain(
      kind,
      event.kernel_id,
      this._names.get(event.kernel_id),
      event.message ?? '',
      event.reason,
      now,
      {
        profile: event.profile,
        declared: event.declared,
        withServer: event.reason === 'server_stopped'
      }
    );
    return {
      show: [notice],
      dismiss: [...this._dropWarning(event.kernel_id, kind), ...this._supersede(notice)]
    };
  }

  /**
   * Whether the kernel sleeps between cells by its rule (`sleeps_after_cell`): it wakes for nearly every
   * cell, which the cell's own output says ("Resuming…"), so its wake is no news worth a toast.
   */
  private _betweenCells(kernelId: string): boolean {
    return (this._me?.kernels ?? []).some(k => k.kernel_id === kernelId && !!k.sleeps_after_cell);
  }

  private _fromRecent(entry: IRecent): INotice | null {
    if (
      entry.at <= this._since ||
      !EXPLAINED.has(entry.kind) ||
      QUIET_REASONS.has(entry.reason ?? '')
    ) {
      return null;
    }
    if (this._recentlyShown(entry.kind, entry.kernel_id, entry.at)) {
      return null;
    }
    this._remember(entry.kind, entry.kernel_id, entry.at);
    return this._explain(
      entry.kind,
      entry.kernel_id,
      entry.name || this._names.get(entry.kernel_id),
      entry.message,
      entry.reason,
      entry.at,
      {
        profile: entry.profile ?? undefined,
        declared: entry.declared,
        action: entry.action ?? undefined,
        withServer: entry.with_server
      }
    );
  }

  private _explain(
    kind: string,
    kernelId: string,
    name: string | undefined,
    message: string,
    reason: string | undefined,
    at: number,
    context: { profile?: string; declared?: boolean; action?: string; withServer?: boolean }
  ): INotice {
    const text = explanation(kind, name, reason, message, { ...context, me: this._me });
    const key = `${kind}:${kernelId}:${Math.round(at)}`;
    if (kind === 'refused' && !context.action) {
      this._refusals.set(key, { reason, profile: context.profile, me: this._me });
    }
    const gone =
      kind === 'culled' ||
      kind === 'reclaimed' ||
      (kind === 'released' && context.action !== 'hibernate');
    return {
      key,
      kernelId,
      type: noticeType(kind),
      message: text,
      keepAlive: false,
      openPanel: kind !== 'resumed' && !gone,
      newKernel: gone,
      autoClose: kind === 'resumed' ? 5000 : false,
      kernelGone: gone
    };
  }

  /** A kernel's explanation replaces the one before (it hibernated, then resumed: one toast, not two). */
  private _supersede(notice: INotice): string[] {
    const before = this._explained.get(notice.kernelId);
    this._explained.set(notice.kernelId, notice.key);
    return before && before !== notice.key ? [before] : [];
  }

  private _dropWarning(kernelId: string, kind: string): string[] {
    const key = this._warnings.get(kernelId);
    if (key && kind !== 'queued') {
      this._warnings.delete(kernelId);
      return [key];
    }
    return [];
  }

  /**
   * Whether this happening was explained already. Every explained happening is remembered (not
   * only the latest of its kind): a kernel resumed twice has two `recent` entries, and comparing
   * the older one with the newer time showed the older toast again minutes later.
   */
  private _recentlyShown(kind: string, kernelId: string, at: number): boolean {
    const times = this._shown.get(`${kind}:${kernelId}`) ?? [];
    return times.some(t => Math.abs(t - at) < SAME_HAPPENING);
  }

  private _remember(kind: string, kernelId: string, at: number): void {
    const key = `${kind}:${kernelId}`;
    this._shown.set(key, [...(this._shown.get(key) ?? []), at]);
  }

  /**
   * Shown refusals whose advice no longer holds: "‘X’ would start now" after the pool filled up,
   * or a profile that starts now where none did. The toast is withdrawn (never shown again): the
   * GPU panel says what starts now.
   */
  private _staleRefusals(me: IMe): string[] {
    const stale: string[] = [];
    for (const [key, refusal] of this._refusals) {
      const now = explanation('refused', undefined, refusal.reason, '', {
        me,
        profile: refusal.profile
      });
      const then = explanation('refused', undefined, refusal.reason, '', {
        me: refusal.me,
        profile: refusal.profile
      });
      if (now !== then) {
        stale.push(key);
        this._refusals.delete(key);
      }
    }
    return stale;
  }

  private _since: number;
  private _me: IMe | null = null;
  private _warnings = new Map<string, string>();
  private _shown = new Map<string, number[]>(); // kind:kernel id -> times of the happenings explained
  private _refusals = new Map<string, { reason?: string; profile?: string; me: IMe | null }>();
  private _explained = new Map<string, string>(); // kernel id -> key of its latest explanation
  private _names = new Map<string, string>();
}
