/**
 * From the server's state (GET me) to what the user's widgets show: the status
 * bar item, the panel's quota bars and kernel cards, the notebook toolbar's
 * indicator and the "What happened" list.
 *
 * Pure functions of their arguments (the server time `now` included), so that
 * every label, colour level, countdown and button is unit-tested, and the React
 * components only lay them out.
 */

import {
  baseName,
  formatBytes,
  formatClock,
  formatCountdown,
  formatDeadline,
  formatWhen,
  formatDuration,
  formatHours,
  formatPercent,
  formatUsedOf,
  gpuShortName,
  kernelName,
  kernelsText,
  plainNote,
  sparklinePoints,
  trimNumber
} from './format';
import { __ } from './i18n';
import {
  borrowedFrom,
  keptForMe,
  onBorrowedRoom,
  shownReservations,
  warnedFor
} from './reservations';
import {
  actionWords,
  borrowedLine,
  borrowedWords,
  kindWord,
  reasonPhrase,
  reasonWords,
  reservationSentence,
  reservationWords,
  reservedFor,
  sentence,
  stateWord
} from './words';
import type { IBudget, IKernel, IMe, IRecent, IReservation, KernelAction } from './types';

/** Use at or above this share of a quota (or budget) turns the status item to "near". */
export const NEAR_QUOTA = 0.8;

/** The sparkline shows this many seconds of utilization. */
export const SPARKLINE_WINDOW = 300;

/** What a card says of declared GPUs wherever a move is shown. */
export function declaredNote(): string {
  return __('declared: no GPU memory to move');
}

export type StatusLevel = 'loading' | 'off' | 'lost' | 'ok' | 'near' | 'warning';

export interface IStatusView {
  text: string;
  /**
   * The text in a window narrower than 1200 px, where JupyterLab's status bar has no room for all
   * of it: the budget, what is near its limit and a start's progress (the rest is in the tooltip).
   */
  short: string;
  level: StatusLevel;
  /** Longer explanation for the tooltip and screen readers. */
  title: string;
}

/** Mean GPU utilization of the kernels that have a reading, or null. */
export function meanUtilization(kernels: ReadonlyArray<IKernel>): number | null {
  const readings = kernels
    .map(k => k.utilization?.current)
    .filter((v): v is number => typeof v === 'number' && isFinite(v));
  if (!readings.length) {
    return null;
  }
  return readings.reduce((a, b) => a + b, 0) / readings.length;
}

/** Shares of each limited resource the user holds (1 = the limit). */
function shares(me: IMe): { memory: number | null; kernels: number | null; sm: number | null } {
  return {
    memory: me.quota.memory ? me.usage.memory / me.quota.memory : null,
    kernels: me.quota.kernels ? me.usage.kernels / me.quota.kernels : null,
    sm: me.quota.sm_percent ? me.usage.sm_percent / me.quota.sm_percent : null
  };
}

/** How close the user is to their quota: the largest used share among the limited resources. */
export function quotaShare(me: IMe): number {
  const s = shares(me);
  const found = [s.memory, s.kernels, s.sm].filter((v): v is number => v !== null);
  return found.length ? Math.max(...found) : 0;
}

/** "GPU time this week: 6.2 of 10 h" (a budget's period is a day, a week or a month). */
export function budgetText(budget: IBudget): string {
  const used = trimNumber(budget.used_hours);
  const limit = formatHours(budget.gpu_hours);
  switch (budget.period) {
    case 'day':
      return __('GPU time today: %1 of %2', used, limit);
    case 'month':
      return __('GPU time this month: %1 of %2', used, limit);
    default:
      return __('GPU time this week: %1 of %2', used, limit);
  }
}

/** "GPU time this week": the panel's label of the budget's bar. */
export function budgetLabel(budget: IBudget): string {
  switch (budget.period) {
    case 'day':
      return __('GPU time today');
    case 'month':
      return __('GPU time this month');
    default:
      return __('GPU time this week');
  }
}

export function budgetShare(budget: IBudget): number {
  return budget.gpu_hours > 0 ? budget.used_hours / budget.gpu_hours : 1;
}

/** The status bar's words for a start's progress: short, the whole of it in the tooltip. */
const PROGRESS_SHOWN = 40;

/**
 * The status bar item, "used / limit" with a label as jupyter-resource-usage writes it:
 * "GPU mem: 10 / 40 GiB · 37%". Where the kernel count is the limit reached it says so
 * ("GPU kernels: 2 / 2"); a GPU-hour budget adds it in words ("GPU time this week: 6.2 of
 * 10 h"); a kernel whose pod is starting, what it does ("starting: Pulling image…"); a
 * reservation keeping room for the user now, its words ("ML 101 lab: 160 GiB reserved until 12:00").
 */
export function statusView(
  me: IMe | null,
  error: string | null,
  now: number,
  unreachableSince: number | null = null
): IStatusView {
  const off = statusWithoutPool(me, error, now, unreachableSince);
  if (off || !me) {
    return off!;
  }
  const held = heldText(me);
  const util = meanUtilization(me.kernels);
  const budget = me.budget ? budgetText(me.budget) : '';
  const progress = progressText(me);
  const reserved = keptForMe(me).map(r => reservationWords(r, now));
  const base = [held, util === null ? '' : formatPercent(util), budget, progress];
  const parts = [...base, ...reserved];
  // A narrow window: the budget, what is near its limit, a start's progress (a reservation's words
  // would push JupyterLab's own items off: the tooltip has them).
  const short = budget ? [quotaShare(me) >= NEAR_QUOTA ? held : '', budget, progress] : base;
  const join = (texts: string[]) => texts.filter(Boolean).join(' · ');
  return {
    text: join(parts),
    short: join(short),
    level: statusLevel(me),
    title: statusLines(me, now).join('\n')
  };
}

/** The status item where there is no pool to read: unreachable, not read yet, or none. */
function statusWithoutPool(
  me: IMe | null,
  error: string | null,
  now: number,
  unreachableSince: number | null
): IStatusView | null {
  const plain = (text: string, level: StatusLevel, title: string) => ({
    text,
    short: text,
    level,
    title
  });
  if (unreachableSince !== null) {
    // The server is gone (stopped, or the network): what it said last would be a stale story.
    return plain(__('GPU pool unreachable'), 'lost', unreachableText(unreachableSince, now));
  }
  if (!me) {
    return error
      ? plain(__('no GPU pool'), 'off', __('No GPU pool on this server: %1', error))
      : plain(__('GPU …'), 'loading', __('Reading the GPU pool…'));
  }
  if (!me.pool.enabled) {
    return plain(
      __('no GPU pool'),
      'off',
      __('No GPU pool on this server: %1', plainNote(me.pool.note))
    );
  }
  return null;
}

/** Whether the kernel count is the limit the user reached. */
function kernelsBind(me: IMe): boolean {
  const s = shares(me);
  return s.kernels !== null && s.kernels >= 1 && (s.memory === null || s.kernels >= s.memory);
}

/** "GPU mem: 10 / 40 GiB", "GPU kernels: 2 / 2", "GPU mem: 10 GiB held". */
function heldText(me: IMe): string {
  return kernelsBind(me)
    ? __('GPU kernels: %1 / %2', me.usage.kernels, me.quota.kernels ?? '')
    : me.quota.memory !== null
      ? __('GPU mem: %1', formatUsedOf(me.usage.memory, me.quota.memory))
      : __('GPU mem: %1 held', formatBytes(me.usage.memory));
}

/** A start's progress (Kubernetes), or a kernel woken in advance: "starting: Pulling image…". */
function progressText(me: IMe): string {
  const starting = me.kernels.filter(k => k.progress);
  const said = starting.length === 1 ? starting[0].progress! : '';
  const waking = me.kernels.some(k => k.woken_on_hint && k.state === 'resuming');
  return waking && !starting.length
    ? __('waking up…')
    : starting.length > 1
      ? __('%1 kernels starting', starting.length)
      : said
        ? __(
            'starting: %1',
            said.length > PROGRESS_SHOWN ? `${said.slice(0, PROGRESS_SHOWN - 1)}…` : said
          )
        : '';
}

/** The status item's colour: a pending action, else near a limit or in the queue. */
function statusLevel(me: IMe): StatusLevel {
  if (me.kernels.some(k => pendingWarning(k))) {
    return 'warning';
  }
  const near =
    quotaShare(me) >= NEAR_QUOTA ||
    me.kernels.some(k => k.state === 'queued') ||
    (!!me.budget && budgetShare(me.budget) >= NEAR_QUOTA);
  return near ? 'near' : 'ok';
}

/** The tooltip, spelt out: what the user holds against their quota, then each kernel's news. */
function statusLines(me: IMe, now: number): string[] {
  const holding = __(
    'You hold %1 of GPU memory in %2',
    formatBytes(me.usage.memory),
    kernelsText(me.usage.kernels)
  );
  const limits = [
    me.quota.memory !== null ? formatBytes(me.quota.memory) : '',
    me.quota.kernels !== null ? kernelsText(me.quota.kernels) : '',
    me.quota.sm_percent !== null ? __('%1% SM share', me.quota.sm_percent) : ''
  ].filter(Boolean);
  const lines = [
    limits.length
      ? __('%1; your quota is %2.', holding, limits.join(', '))
      : __('%1; you have no quota.', holding)
  ];
  if (kernelsBind(me)) {
    lines.push(
      __('You hold as many GPU kernels as your quota allows: shut one down to start another.')
    );
  }
  if (me.budget) {
    const resets = new Date(me.budget.resets_at * 1000).toLocaleString();
    lines.push(__('%1 (resets %2).', budgetText(me.budget), resets));
  }
  const util = meanUtilization(me.kernels);
  if (util !== null) {
    lines.push(__('GPU utilization of your kernels: %1.', formatPercent(util)));
  }
  lines.push(...kernelLines(me, now));
  lines.push(...shownReservations(me).map(r => reservationSentence(r, now)));
  lines.push(__('Pool: %1', plainNote(me.pool.note)));
  lines.push(__('Click to open the GPU panel.'));
  return lines;
}

/** What the tooltip says of each kernel: starting, warned, on borrowed room, queued (and why there). */
function kernelLines(me: IMe, now: number): string[] {
  const lines: string[] = [];
  const name = (k: IKernel) => kernelName(k.name, k.kernel_id, true); // each line starts with it
  for (const k of me.kernels.filter(k => k.progress)) {
    lines.push(__('%1 is starting: %2.', name(k), k.progress!));
  }
  for (const k of me.kernels.filter(k => pendingWarning(k))) {
    lines.push(__('%1: %2.', name(k), countdownText(k, now)));
  }
  for (const k of me.kernels.filter(onBorrowedRoom)) {
    lines.push(borrowedLine(name(k), borrowedFrom(k, me.reservations), now));
  }
  for (const k of me.kernels.filter(k => k.state === 'queued')) {
    lines.push(__('%1: queued at position %2.', name(k), k.queue_position ?? '?'));
    const why = queueWhy(me, k.kernel_id);
    if (why) {
      lines.push(sentence(why));
    }
  }
  return lines;
}

/** Why a kernel of `me` waits where it is in the queue, where the admin's sharing orders it (else null). */
export function queueWhy(me: IMe | null, kernelId: string): string | null {
  return me?.queue.find(q => q.kernel_id === kernelId)?.why || null;
}

/** What the panel and the status bar say while the server does not answer. */
export function unreachableText(since: number, now: number): string {
  return __(
    'The GPU pool cannot be reached: the server has not answered since %1. Is Jupyter still running? The figures shown are from then; they come back when it answers.',
    formatWhen(since, now)
  );
}

export interface IActionView {
  action: KernelAction;
  label: string;
  title: string;
  /** Ask before doing it: it loses the kernel's state, or stops a computation. */
  confirm: { title: string; body: string; button: string } | null;
}

export interface IMeterView {
  label: string;
  text: string;
  /** 0..1, or null where there is no reading or no limit (then it is no meter). */
  fraction: number | null;
  level: 'ok' | 'near' | 'over';
  /** Said beside the label: "no reading (declared GPU)". */
  note: string;
  /** No bar at all, its text only: a resource without a limit (an empty bar says nothing). */
  textOnly?: boolean;
}

export interface ICardView {
  kernelId: string;
  title: string;
  path: string;
  profile: string;
  sliceLabel: string;
  gpu: string;
  declared: boolean;
  memory: IMeterView;
  utilization: {
    text: string;
    points: string;
    label: string;
  };
  state: { kind: string; label: string; detail: string };
  countdown: {
    text: string;
    /** What happens and what the user can still do, in our words; the server's sentence is `detail`. */
    message: string;
    detail: string;
    level: 'warning';
  } | null;
  /** It runs on room borrowed from a reservation: what that means (else ""). */
  borrowed: string;
  /** Queued where the admin's sharing orders the queue: why it is where it is, as a sentence (else ""). */
  queueWhy: string;
  actions: IActionView[];
}

/** Whether every GPU the kernel holds (or held) is declared: a pool without real GPUs. */
export function onDeclaredGpus(kernel: IKernel): boolean {
  const gpus = kernel.gpus ?? [];
  return gpus.length > 0 && gpus.every(g => g.source === 'declared');
}

/**
 * Whether a deadline's reason no longer fits the kernel's state: "hibernated too long" for a
 * kernel that has resumed. The server replaces it at its next pass (up to its interval later);
 * until then the card would threaten a shutdown for a limit the kernel no longer runs against.
 */
export function staleReason(kernel: IKernel, reason: string | undefined | null): boolean {
  return reason === 'max_hibernated' && kernel.state !== 'hibernated';
}

/** The kernel's pending warning, or null (none, or a stale one: see staleReason). */
export function pendingWarning(kernel: IKernel): IKernel['warning'] {
  const w = kernel.warning ?? null;
  return w && !staleReason(kernel, w.reason) ? w : null;
}

export function countdownText(kernel: IKernel, now: number): string {
  const w = pendingWarning(kernel);
  if (!w) {
    return '';
  }
  const left = w.deadline - now;
  if (left <= 0) {
    return actionWords(w.action).now;
  }
  const at = formatDeadline(w.deadline, now);
  return w.action === 'hibernate'
    ? __('hibernates in %1 (at %2)', formatCountdown(left), at)
    : __('shuts down in %1 (at %2)', formatCountdown(left), at);
}

/** Whether the kernel's slice is an NVIDIA MPS one: it can never hibernate (its idle rule shuts it down). */
export function onMps(kernel: IKernel): boolean {
  return kernel.isolation === 'mps';
}

/** Whether the user can still Keep alive (snooze) the pending action. */
export function canKeepAlive(kernel: IKernel): boolean {
  const w = pendingWarning(kernel);
  // Room reserved for others is given back at its time: a snooze cannot keep it (the server refuses).
  return (
    !!w &&
    w.reason !== 'reserved' &&
    w.snoozes_left > 0 &&
    (kernel.actions ?? []).includes('snooze')
  );
}

/**
 * The line under a countdown: why, what it costs, and what the user can still do. `reservations`
 * (GET me's) name the reservation a kernel gives its room back for; `now`, the time its words say.
 */
export function warningConsequence(
  kernel: IKernel,
  reservations?: ReadonlyArray<IReservation>,
  now?: number
): string {
  const w = pendingWarning(kernel);
  if (!w) {
    return '';
  }
  if (w.reason === 'reserved') {
    return reservedConsequence(kernel, warnedFor(kernel, reservations), now ?? w.deadline);
  }
  const why = reasonPhrase(w.reason);
  const Why = why.charAt(0).toUpperCase() + why.slice(1);
  if (w.reason === 'over_memory') {
    return __(
      '%1: free GPU memory in the kernel (del tensors, empty the cache) or it shuts down.',
      Why
    );
  }
  if (w.reason === 'budget') {
    return __('%1: its GPU slice goes back when the time runs out. Save your work.', Why);
  }
  const keep = canKeepAlive(kernel);
  if (w.action === 'hibernate') {
    return keep
      ? __(
          '%1: its GPU slice goes back to the pool, its variables are kept. Run a cell or Keep alive to keep the slice.',
          Why
        )
      : __(
          '%1: its GPU slice goes back to the pool, its variables are kept. Run a cell to keep the slice.',
          Why
        );
  }
  if (onMps(kernel)) {
    return keep
      ? __(
          '%1: it cannot hibernate, so it shuts down and its variables will be lost. Run a cell or Keep alive to keep it.',
          Why
        )
      : __(
          '%1: it cannot hibernate, so it shuts down and its variables will be lost. Run a cell to keep it, or save your work.',
          Why
        );
  }
  return keep
    ? __('%1: its variables will be lost. Run a cell or Keep alive to keep it.', Why)
    : __('%1: its variables will be lost. Run a cell to keep it, or save your work.', Why);
}

/** A kernel giving its room back to a reservation: when, what it keeps, and that using it keeps nothing. */
function reservedConsequence(kernel: IKernel, r: IReservation | null, now: number): string {
  const why = __('Its GPU room is %1', reservedFor(r, now));
  if (kernel.warning!.action === 'hibernate') {
    return __(
      '%1: it gives its GPU slice back at that time and keeps its variables. Running a cell does not keep the room.',
      why
    );
  }
  return onMps(kernel)
    ? __(
        '%1: it cannot hibernate, so it shuts down at that time and its variables will be lost. Save your work.',
        why
      )
    : __('%1: it shuts down at that time and its variables will be lost. Save your work.', why);
}

/**
 * "will be hibernated at 14:05 if still idle"; a shutdown says that the variables will be lost (an MPS
 * kernel's, that it cannot hibernate), as its warning and its launcher card do.
 */
function nextActionText(kernel: IKernel, now: number): string {
  const next = kernel.next_action;
  if (!next || next.at <= now || staleReason(kernel, next.reason)) {
    return '';
  }
  const when = formatDeadline(next.at, now);
  const idle = next.reason === 'idle' || next.reason === 'gpu_idle';
  const why = reasonPhrase(next.reason);
  if (next.action === 'hibernate') {
    return idle
      ? __('will be hibernated at %1 if still idle', when)
      : __('will be hibernated at %1 (%2)', when, why);
  }
  if (onMps(kernel)) {
    return idle
      ? __(
          'will be shut down at %1 if still idle (it cannot hibernate): its variables will be lost',
          when
        )
      : __(
          'will be shut down at %1 (%2; it cannot hibernate): its variables will be lost',
          when,
          why
        );
  }
  return idle
    ? __('will be shut down at %1 if still idle: its variables will be lost', when)
    : __('will be shut down at %1 (%2): its variables will be lost', when, why);
}

type StateLine = { kind: string; label: string; detail: string };

/**
 * The card's state line. `waiting`: a cell of this browser's notebook waits on the kernel (its
 * connection says busy); on a hibernated kernel that means the server is resuming it for the cell.
 */
export function stateView(kernel: IKernel, now: number, waiting = false): StateLine {
  const movedNote = onDeclaredGpus(kernel) ? ` (${declaredNote()})` : '';
  const state = kernel.state === 'hibernated' && waiting ? 'resuming' : kernel.state;
  if (kernel.progress) {
    // Its pod is starting (Kubernetes): what it does now, in the server's plain words.
    return { kind: 'starting', label: __('starting: %1', kernel.progress), detail: '' };
  }
  switch (state) {
    case 'active':
      return activeState(kernel, now);
    case 'hibernating':
      return {
        kind: 'hibernating',
        label: movedNote
          ? __('hibernating: giving the GPU slice back%1…', movedNote)
          : __('hibernating: moving GPU memory to host RAM…'),
        detail: ''
      };
    case 'stopping':
      // The pool's action at a deadline (or a shutdown asked for) is under way: nothing to keep alive.
      return {
        kind: 'stopping',
        label: __('shutting down: giving the GPU slice back…'),
        detail: ''
      };
    case 'hibernated':
    case 'no_gpu_yet':
    case 'resuming':
    case 'queued':
      return sleepState(kernel, state, waiting, movedNote);
    case 'released':
      return { kind: 'released', label: __('released: no GPU held'), detail: '' };
    default:
      return { kind: 'unknown', label: stateWord(kernel.state), detail: '' };
  }
}

/** An active kernel: running, starting, or idle since when, and what the idle rule does next. */
function activeState(kernel: IKernel, now: number): StateLine {
  const exec = kernel.execution_state;
  if (exec === 'busy') {
    return { kind: 'running', label: __('running'), detail: '' };
  }
  if (exec === 'starting') {
    return { kind: 'starting', label: __('starting'), detail: '' };
  }
  // A pending warning says everything (its countdown); no stale "kept alive until" beside it.
  const warned = !!pendingWarning(kernel);
  const snoozed =
    !warned && kernel.snoozed_until && kernel.snoozed_until > now ? kernel.snoozed_until : 0;
  // "kept alive until 19:25 · will be hibernated at 19:25" read as a contradiction: where the
  // idle rule acts when the Keep alive ends, one sentence says both.
  const then = kernel.next_action;
  const joined =
    !!snoozed &&
    !!then &&
    (then.reason === 'idle' || then.reason === 'gpu_idle') &&
    Math.abs(then.at - snoozed) < 60;
  const until = formatWhen(snoozed, now);
  const kept = !snoozed
    ? ''
    : !joined
      ? __('kept alive until %1', until)
      : then!.action === 'hibernate'
        ? __('kept alive until %1, then hibernated if still idle', until)
        : __(
            'kept alive until %1, then shut down if still idle: its variables will be lost',
            until
          );
  const label = kernel.idle_since
    ? __(
        'idle since %1 (%2)',
        formatClock(kernel.idle_since),
        formatDuration(now - kernel.idle_since)
      )
    : __('idle');
  const between = kernel.sleeps_after_cell
    ? __(
        'sleeps %1 after each cell, wakes when a cell runs',
        formatDuration(kernel.sleeps_after_cell)
      )
    : '';
  const next = warned || joined ? '' : nextActionText(kernel, now);
  return { kind: 'idle', label, detail: [between, kept, next].filter(Boolean).join(' · ') };
}

/** A kernel without its slice: hibernated, never given one yet, taking one, or waiting for one. */
function sleepState(
  kernel: IKernel,
  state: string,
  waiting: boolean,
  movedNote: string
): StateLine {
  switch (state) {
    case 'hibernated':
      return kernel.sleeps_after_cell
        ? {
            // Its rule: it holds a GPU only while cells run. Nothing is wrong; a cell wakes it.
            kind: 'hibernated',
            label: __('asleep between cells: GPU slice given back, variables kept%1', movedNote),
            detail: __('It wakes when a cell runs.')
          }
        : {
            kind: 'hibernated',
            label: __('hibernated: GPU slice given back, variables kept%1', movedNote),
            detail: __('Run a cell (or Resume) to take a slice again and go on.')
          };
    case 'no_gpu_yet':
      // Started without a slice (the rule's slice_at: first-cell): not hibernated, nothing to restore.
      return waiting
        ? {
            kind: 'resuming',
            label: __('taking a GPU slice for the first cell…'),
            detail: __('Your cell runs as soon as it holds the slice.')
          }
        : { kind: 'no_gpu_yet', label: __('no GPU yet: takes one when a cell runs'), detail: '' };
    case 'resuming':
      return kernel.woken_on_hint && !waiting
        ? {
            kind: 'resuming',
            label: __('waking up…'),
            detail: __('Its notebook is open: it takes its GPU slice again before your next cell.')
          }
        : {
            kind: 'resuming',
            label: __('resuming: taking a GPU slice again%1…', movedNote),
            detail: __('Your cell runs as soon as it holds the slice.')
          };
    default: {
      const position = kernel.queue_position ?? '?';
      return kernel.lease_id
        ? {
            kind: 'queued',
            label: __('queued at position %1: waits for a free slice to resume', position),
            detail: __('Your cell runs once a slice frees up and the kernel resumes.')
          }
        : {
            kind: 'queued',
            label: __('queued at position %1: starts when a slice frees up', position),
            detail: ''
          };
    }
  }
}

const ACTION_ORDER: KernelAction[] = ['snooze', 'release', 'resume', 'shutdown'];

export function actionViews(kernel: IKernel): IActionView[] {
  const name = baseName(kernel.name) || __('this kernel');
  const running = kernel.execution_state === 'busy';
  const views: Array<IActionView | null> = ACTION_ORDER.filter(action =>
    (kernel.actions ?? []).includes(action)
  ).map(action => {
    switch (action) {
      case 'snooze':
        return keepAliveView(kernel);
      case 'release':
        return releaseView(kernel, name, running);
      case 'resume':
        return {
          action,
          label: __('Resume'),
          title: onDeclaredGpus(kernel)
            ? __('Take a GPU slice again (declared GPU: no GPU memory to restore)')
            : __('Take a GPU slice again and restore the kernel’s GPU memory'),
          confirm: null
        };
      default:
        return {
          action,
          label: __('Shut down'),
          title: __('Shut the kernel down (its variables are lost)'),
          confirm: {
            title: __('Shut down kernel'),
            body: running
              ? __(
                  'Shut down %1? Its variables will be lost. It is running a computation now: that computation stops too.',
                  name
                )
              : __('Shut down %1? Its variables will be lost.', name),
            button: __('Shut down')
          }
        };
    }
  });
  return views.filter((v): v is IActionView => v !== null);
}

/** Keep alive only postpones a pending action: without one it would spend a snooze on nothing. */
function keepAliveView(kernel: IKernel): IActionView | null {
  const w = pendingWarning(kernel);
  if (!w || !canKeepAlive(kernel)) {
    return null;
  }
  return {
    action: 'snooze',
    label: __('Keep alive'),
    title: __(
      'Postpone the %1 by %2 (%3 left)',
      actionWords(w.action).noun,
      formatDuration(w.snooze_seconds),
      w.snoozes_left === 1 ? __('1 snooze') : __('%1 snoozes', w.snoozes_left)
    ),
    confirm: null
  };
}

/** Release GPU: hibernate where the rule says so and the kernel can (asking if it runs), else shut down (asking). */
function releaseView(kernel: IKernel, name: string, running: boolean): IActionView {
  const hibernates = kernel.release_action === 'hibernate';
  const title = hibernates
    ? __('Hibernate now: give the GPU slice back and keep the variables in host memory')
    : onMps(kernel)
      ? // In words, not the driver's error number: an MPS client cannot be checkpointed.
        __(
          'Shut the kernel down now to give its GPU slice back (its variables are lost): a kernel on an NVIDIA MPS slice cannot hibernate.'
        )
      : kernel.hibernate_unavailable
        ? __(
            'Shut the kernel down now to give its GPU slice back (its variables are lost): it cannot hibernate (%1).',
            kernel.hibernate_unavailable
          )
        : __('Shut the kernel down now to give its GPU slice back (its variables are lost).');
  const ask = !hibernates
    ? {
        title: __('Release GPU'),
        body: running
          ? __(
              'Shut down %1 to give its GPU slice back? Its variables will be lost. It is running a computation now: that computation stops too.',
              name
            )
          : __('Shut down %1 to give its GPU slice back? Its variables will be lost.', name),
        button: __('Shut down')
      }
    : running
      ? {
          title: __('Release GPU'),
          body: __(
            '%1 is running a computation now. A busy kernel cannot hibernate: the pool will refuse until the cell finishes.',
            name
          ),
          button: __('Try anyway')
        }
      : null;
  return { action: 'release', label: __('Release GPU'), title, confirm: ask };
}

/**
 * A kernel object with every list and nullable field present: the server sends
 * a short object for a start still waiting in the queue (no slice, no GPUs).
 */
export function complete(kernel: IKernel): IKernel {
  return {
    ...kernel,
    slice: kernel.slice ?? null,
    gpus: kernel.gpus ?? [],
    memory_used: kernel.memory_used ?? null,
    memory_limit: kernel.memory_limit ?? null,
    utilization: kernel.utilization ?? null,
    queue_position: kernel.queue_position ?? null,
    warning: kernel.warning ?? null,
    actions: kernel.actions ?? []
  };
}

/**
 * A kernel's card. `waiting`: a cell of this browser's notebook waits on it; `me` (GET me) says which
 * reservation it borrowed room from or gives its room back to, and why it waits where it is in the queue.
 */
export function cardView(
  given: IKernel,
  now: number,
  waiting = false,
  me: IMe | null = null
): ICardView {
  const kernel = complete(given);
  const declared = onDeclaredGpus(kernel);
  const holdsGpu =
    kernel.gpus.length > 0 && !['hibernated', 'queued', 'released'].includes(kernel.state);
  // "declared" once per card (the memory line's "no reading (declared GPU)"): the GPU's label
  // without it, short enough not to be cut in a narrow panel.
  const gpu = holdsGpu
    ? kernel.gpus
        .map(g => (g.source === 'declared' ? g.label.replace(/ \(declared\)$/, '') : g.label))
        .join(', ')
    : kernel.state === 'queued'
      ? __('waiting for a GPU')
      : __('no GPU held');
  const warned = pendingWarning(kernel);
  const why = kernel.state === 'queued' ? queueWhy(me, kernel.kernel_id) : null;
  return {
    kernelId: kernel.kernel_id,
    title: kernelName(kernel.name, kernel.kernel_id),
    path: kernel.name,
    profile: kernel.profile_display_name || kernel.profile,
    sliceLabel: kernel.slice?.label ?? '',
    gpu,
    declared,
    memory: memoryMeter(kernel, holdsGpu, declared),
    utilization: utilizationView(kernel, holdsGpu, now),
    state: stateView(kernel, now, waiting),
    countdown: warned
      ? {
          text: countdownText(kernel, now),
          message: warningConsequence(kernel, me?.reservations, now),
          detail: warned.message,
          level: 'warning'
        }
      : null,
    borrowed: onBorrowedRoom(kernel)
      ? borrowedWords(borrowedFrom(kernel, me?.reservations), now)
      : '',
    queueWhy: why ? sentence(why) : '',
    actions: actionViews(kernel)
  };
}

/** The card's memory bar: used of the slice, its size where there is no reading, 0 where none is held. */
function memoryMeter(kernel: IKernel, holdsGpu: boolean, declared: boolean): IMeterView {
  const limit = kernel.memory_limit ?? kernel.slice?.memory ?? null;
  const used = kernel.memory_used;
  if (!holdsGpu) {
    return {
      label: __('Memory'),
      text: limit === null ? __('none held') : __('0 of %1', formatBytes(limit)),
      fraction: 0,
      level: 'ok',
      note: ''
    };
  }
  if (used === null) {
    return {
      label: __('Memory'),
      text: limit === null ? '–' : __('%1 slice', formatBytes(limit)),
      fraction: null,
      level: 'ok',
      note: declared ? __('no reading (declared GPU)') : __('no reading')
    };
  }
  const fraction = limit ? Math.min(1, Math.max(0, used / limit)) : null;
  return {
    label: __('Memory'),
    text:
      limit === null ? formatBytes(used) : __('%1 of %2', formatBytes(used), formatBytes(limit)),
    fraction,
    level: fraction !== null && fraction >= 0.9 ? 'near' : 'ok',
    note: ''
  };
}

/** The card's utilization: now, and the sparkline of the last minutes with its summary. */
function utilizationView(
  kernel: IKernel,
  holdsGpu: boolean,
  now: number
): ICardView['utilization'] {
  const util = kernel.utilization;
  const current = holdsGpu ? (util?.current ?? null) : null;
  const samples = util?.samples ?? [];
  const recentValues = samples
    .filter(([t, p]) => t >= now - SPARKLINE_WINDOW && p !== null)
    .map(([, p]) => p as number);
  return {
    text: current === null ? __('no reading') : formatPercent(current),
    points: sparklinePoints(samples, now, SPARKLINE_WINDOW, 100, 24),
    label:
      current === null
        ? __('GPU utilization: no reading')
        : __(
            'GPU utilization %1 now; last %2: %3',
            formatPercent(current),
            formatDuration(SPARKLINE_WINDOW),
            recentValues.length
              ? __(
                  'min %1, max %2',
                  formatPercent(Math.min(...recentValues)),
                  formatPercent(Math.max(...recentValues))
                )
              : __('no samples')
          )
  };
}

/** The panel's header: the user's quota use, one bar per resource (a meter only where there is a limit). */
export function quotaBars(me: IMe): IMeterView[] {
  const level = (f: number): IMeterView['level'] =>
    f > 1 ? 'over' : f >= NEAR_QUOTA ? 'near' : 'ok';
  const bars: IMeterView[] = [];
  const mem = me.quota.memory;
  bars.push({
    label: __('GPU memory'),
    text:
      mem === null
        ? __('%1 (no limit)', formatBytes(me.usage.memory))
        : __('%1 of %2', formatBytes(me.usage.memory), formatBytes(mem)),
    fraction: mem ? Math.min(1, me.usage.memory / mem) : null,
    level: mem ? level(me.usage.memory / mem) : 'ok',
    note: '',
    textOnly: !mem
  });
  const k = me.quota.kernels;
  bars.push({
    label: __('GPU kernels'),
    text: k === null ? __('%1 (no limit)', me.usage.kernels) : __('%1 of %2', me.usage.kernels, k),
    fraction: k ? Math.min(1, me.usage.kernels / k) : null,
    level: k ? level(me.usage.kernels / k) : 'ok',
    note: k !== null && me.usage.kernels >= k ? __('limit reached') : '',
    textOnly: !k
  });
  if (me.quota.sm_percent !== null) {
    bars.push({
      label: __('SM share'),
      text: __('%1% of %2%', me.usage.sm_percent, me.quota.sm_percent),
      fraction: me.quota.sm_percent ? Math.min(1, me.usage.sm_percent / me.quota.sm_percent) : null,
      level: me.quota.sm_percent ? level(me.usage.sm_percent / me.quota.sm_percent) : 'ok',
      note: ''
    });
  }
  if (me.budget) {
    const share = budgetShare(me.budget);
    bars.push({
      label: budgetLabel(me.budget),
      text: __('%1 of %2', trimNumber(me.budget.used_hours), formatHours(me.budget.gpu_hours)),
      fraction: Math.min(1, share),
      level: level(share),
      note: ''
    });
  }
  for (const g of me.groups) {
    bars.push({
      label: __('Group %1', g.name),
      text: g.quota.memory
        ? __('%1 of %2', formatBytes(g.usage.memory), formatBytes(g.quota.memory))
        : __('%1 (no limit)', formatBytes(g.usage.memory)),
      fraction: g.quota.memory ? Math.min(1, g.usage.memory / g.quota.memory) : null,
      level: g.quota.memory ? level(g.usage.memory / g.quota.memory) : 'ok',
      note: '',
      textOnly: !g.quota.memory
    });
  }
  return bars;
}

/** The notebook toolbar's indicator for the kernel with this id: where its slice is, in few words ("GPU 0 (declared)"). */
export interface IIndicatorView {
  visible: boolean;
  text: string;
  title: string;
  kind: string;
}

export function indicatorView(me: IMe | null, kernelId: string | null): IIndicatorView {
  const hidden = { visible: false, text: '', title: '', kind: 'none' };
  if (!me || !me.pool.enabled || !kernelId) {
    return hidden;
  }
  const found = me.kernels.find(x => x.kernel_id === kernelId);
  if (!found) {
    return hidden;
  }
  const k = complete(found);
  const declared = onDeclaredGpus(k);
  const where = k.gpus.map(g => gpuShortName(g.label)).join('+');
  let text: string;
  switch (k.state) {
    case 'active':
      text = !where
        ? __('GPU')
        : k.slice?.whole
          ? declared
            ? __('%1 (whole, declared)', where)
            : __('%1 (whole)', where)
          : declared
            ? __('%1 (declared)', where)
            : where;
      break;
    case 'queued':
      text = __('queued #%1', k.queue_position ?? '?');
      break;
    case 'hibernated':
      // Its rule's sleep between cells is not the hibernation of an idle kernel: the card says so too.
      text = k.sleeps_after_cell ? __('asleep between cells') : stateWord(k.state);
      break;
    default: // hibernating, resuming, released
      text = k.state === 'resuming' && k.woken_on_hint ? __('waking up…') : stateWord(k.state);
  }
  const slice = !k.slice?.label
    ? k.profile_display_name || k.profile
    : k.isolation
      ? __('a %1 slice (%2 isolation)', k.slice.label, k.isolation)
      : __('a %1 slice', k.slice.label);
  const lines = [
    k.gpus.length
      ? __('This kernel holds %1 of %2.', slice, k.gpus.map(g => g.label).join(', '))
      : __('This kernel holds no GPU slice now (%1).', slice)
  ];
  if (declared) {
    lines.push(
      __(
        'Declared GPUs exist only in the pool’s inventory: the kernel holds no GPU memory, so hibernating it moves nothing.'
      )
    );
  }
  lines.push(__('State: %1.', stateView(k, me.now).label));
  const why = k.state === 'queued' ? queueWhy(me, k.kernel_id) : null;
  lines.push(why ? sentence(why) : '');
  lines.push(onBorrowedRoom(k) ? borrowedWords(borrowedFrom(k, me.reservations), me.now) : '');
  lines.push(__('Click to open the GPU panel.'));
  return { visible: true, text, title: lines.filter(Boolean).join('\n'), kind: k.state };
}

/**
 * A kernel that ended with its server (stopped, restarted or gone): hibernated or not, its
 * variables went with it; a new kernel starts from the notebook.
 */
export function endedWithServer(): string {
  return __(
    'Ended when the server stopped; its variables are gone. Open the notebook and start a kernel to go on.'
  );
}

/** One line of "What happened": a plain sentence, the rule that decided it last. */
export function historyLine(entry: IRecent): string {
  const text = historyText(entry);
  const rule = entry.rule_label || entry.rule;
  return rule && entry.rule !== 'hibernation' ? __('%1 Rule: %2.', text, rule) : text;
}

function historyText(entry: IRecent): string {
  const why = reasonPhrase(entry.reason);
  const because = reasonWords(entry.reason).because;
  switch (entry.kind) {
    case 'culled':
      return entry.note
        ? __('Shut down because %1, and it could not hibernate; its variables are gone.', because)
        : __('Shut down because %1; its variables are gone.', because);
    case 'hibernated':
      return hibernatedLine(entry);
    case 'resumed':
      return entry.reason === 'hint'
        ? __(
            'Woken in advance as its notebook was opened: it holds a GPU slice again%1.',
            declaredSuffix(entry)
          )
        : __('Resumed: it holds a GPU slice again%1.', declaredSuffix(entry));
    case 'released':
      return releasedLine(entry);
    case 'refused':
      switch (entry.action) {
        case 'resume':
          return __('Could not resume: %1.', why);
        case 'first_cell':
          return __('Could not take its first GPU slice, so its cell did not run: %1.', why);
        case 'hibernate':
          return __('Could not hibernate now (%1); it kept running.', why);
        default:
          return __('Could not start: %1.', why);
      }
    case 'hibernation_failed':
      // The server's own words: what failed, and whether the kernel kept running (or how it was left).
      return sentence(entry.message) || __('Hibernation failed.');
    case 'reclaimed':
      return entry.with_server
        ? endedWithServer()
        : __('Its kernel process ended, so its GPU slice went back to the pool.');
    case 'over_memory':
      return __('Used more GPU memory than its slice.');
    case 'queued':
      return __('Waited in the queue for a GPU slice.');
    case 'warned':
      return __('Warned: %1.', why);
    case 'snoozed':
      return __('Kept alive.');
    default:
      return sentence(entry.message || kindWord(entry.kind));
  }
}

/** " (declared: no GPU memory to move)" where a move was on declared GPUs. */
function declaredSuffix(entry: IRecent): string {
  return entry.declared ? ` (${declaredNote()})` : '';
}

function hibernatedLine(entry: IRecent): string {
  const declared = declaredSuffix(entry);
  switch (entry.reason) {
    case 'hint_unused':
      return __('Back to sleep: woken in advance, but no cell ran; nothing was used%1.', declared);
    case 'after_cell':
      return __(
        'Asleep between cells: its GPU slice went back after its last cell; its variables are kept and its next cell wakes it%1.',
        declared
      );
    case 'admin':
      return __('Hibernated by an admin; its variables are kept%1.', declared);
    case 'user':
      return __('Hibernated at your request; its variables are kept%1.', declared);
    default:
      return __(
        'Hibernated because %1; its variables are kept%2.',
        reasonWords(entry.reason).because,
        declared
      );
  }
}

function releasedLine(entry: IRecent): string {
  if (entry.with_server) {
    return endedWithServer();
  }
  const admin = entry.reason === 'admin';
  if (entry.action === 'hibernate') {
    return admin
      ? __('Gave its GPU slice back at an admin’s request; its variables are kept.')
      : __('Gave its GPU slice back at your request; its variables are kept.');
  }
  if (admin) {
    return __('Shut down by an admin; its variables are gone.');
  }
  return entry.reason && entry.reason !== 'user'
    ? __(
        'Shut down to give its GPU slice back because %1; its variables are gone.',
        reasonWords(entry.reason).because
      )
    : __('Shut down at your request; its variables are gone.');
}

/** Kinds of `recent` entries the user's "What happened" list shows (warnings show as countdowns). */
export const HISTORY_KINDS = new Set([
  'culled',
  'hibernated',
  'resumed',
  'released',
  'refused',
  'hibernation_failed',
  'reclaimed',
  'over_memory',
  'queued'
]);
