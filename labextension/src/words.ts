/**
 * The one catalogue of the words the extension builds its sentences from: why the pool acts (its
 * reasons), what it does (its actions on a kernel), the journal's kinds and the states a kernel or a
 * lease is in, each in the grammatical forms the sentences need. Every sentence that names a reason,
 * an action or a state takes its words from here, and a unit test renders every combination and
 * checks that each reads right (words.spec.ts).
 *
 * To add a reason (a reservation, a fair share…): one entry in REASONS with both of its forms; the
 * test then renders it in every sentence. No DOM here.
 */

import { formatBytes, formatWhen } from './format';
import { __, _n } from './i18n';
import type { IReservation } from './types';

/** A reason for what the pool did or refused, in the forms the sentences use. */
export interface IReasonWords {
  /**
   * A few words that stand alone, in brackets, after a colon or in a table cell: "idle too long",
   * "your GPU quota is used up".
   */
  tag: string;
  /**
   * A whole clause with its subject, in the past, for "… because %1": "it was idle too long",
   * "someone was waiting for a GPU slice".
   */
  because: string;
}

/** Each reason the server sends (docs/api.md), by its code. Functions: the translator is set late. */
const REASONS: Record<string, () => IReasonWords> = {
  idle: () => ({ tag: __('idle too long'), because: __('it was idle too long') }),
  gpu_idle: () => ({
    tag: __('GPU memory held, GPU unused'),
    because: __('it held GPU memory without using the GPU')
  }),
  max_busy: () => ({
    tag: __('busy longer than allowed'),
    because: __('it was busy longer than allowed')
  }),
  max_age: () => ({
    tag: __('maximum kernel age reached'),
    because: __('it reached the maximum kernel age')
  }),
  max_hibernated: () => ({
    tag: __('hibernated too long'),
    because: __('it was hibernated too long')
  }),
  over_memory: () => ({
    tag: __('over its GPU memory slice'),
    because: __('it used more GPU memory than its slice')
  }),
  budget: () => ({
    tag: __('your GPU time is used up'),
    because: __('your GPU time was used up')
  }),
  budget_exceeded: () => REASONS.budget(),
  quota_exceeded: () => ({
    tag: __('your GPU quota is used up'),
    because: __('your GPU quota was used up')
  }),
  pool_exhausted: () => ({
    tag: __('no GPU has room for it'),
    because: __('no GPU had room for it')
  }),
  mps_user_busy: () => ({
    tag: __('every GPU with room serves another user’s MPS kernels'),
    because: __('every GPU with room served another user’s MPS kernels')
  }),
  host_memory: () => ({
    tag: __('host memory is short'),
    because: __('host memory was short')
  }),
  queue_timeout: () => ({
    tag: __('no slice freed up in time'),
    because: __('no slice freed up in time')
  }),
  pressure: () => ({
    tag: __('someone is waiting for a GPU slice'),
    because: __('someone was waiting for a GPU slice')
  }),
  // Chosen to give back room a reservation keeps for others (its name and times: reservedFor).
  reserved: () => ({
    tag: __('its GPU room is reserved for others'),
    because: __('its GPU room was reserved for others')
  }),
  cell: () => ({ tag: __('a cell ran on it'), because: __('a cell ran on it') }),
  first_cell: () => ({
    tag: __('its first cell ran'),
    because: __('its first cell ran')
  }),
  user: () => ({ tag: __('you asked'), because: __('you asked') }),
  hint: () => ({
    tag: __('its notebook was opened'),
    because: __('its notebook was opened')
  }),
  hint_unused: () => ({
    tag: __('woken in advance, but no cell ran'),
    because: __('it was woken in advance, but no cell ran')
  }),
  after_cell: () => ({
    tag: __('no cell ran for a while after the last one'),
    because: __('no cell ran for a while after the last one')
  }),
  admin: () => ({ tag: __('an admin asked'), because: __('an admin asked') }),
  server_stopped: () => ({
    tag: __('the server stopped'),
    because: __('the server stopped')
  }),
  hibernation_failed: () => ({
    tag: __('a hibernation or resume failed'),
    because: __('a hibernation or resume failed')
  }),
  mps: () => ({
    tag: __('an SM share needs NVIDIA MPS here'),
    because: __('an SM share needed NVIDIA MPS here')
  }),
  config: () => ({
    tag: __('the GPU pool is misconfigured'),
    because: __('the GPU pool was misconfigured')
  })
};

/** The reason codes of the catalogue (the unit test renders each). */
export const KNOWN_REASONS: ReadonlyArray<string> = Object.keys(REASONS);

/** A reason's words; an unknown one is the policy's, with the server's own word for it. */
export function reasonWords(reason: string | undefined | null): IReasonWords {
  const known = reason ? REASONS[reason] : undefined;
  if (known) {
    return known();
  }
  if (!reason) {
    return { tag: __('the pool’s policy'), because: __('the pool’s policy said so') };
  }
  const word = reason.replace(/_/g, ' ');
  return {
    tag: __('the pool’s policy (%1)', word),
    because: __('the pool’s policy said so (%1)', word)
  };
}

/** Why the pool acts, in a few words: "idle too long". */
export function reasonPhrase(reason: string | undefined | null): string {
  return reasonWords(reason).tag;
}

/** What the pool does to a kernel at a deadline: hibernate it, or shut it down. */
export type PoolAction = 'hibernate' | 'shutdown';

/** The pool's actions on a kernel, in the forms the sentences use. */
export interface IActionWords {
  /** The noun: "hibernation", "shutdown". */
  noun: string;
  /** What happens now, in an "-ing" form for a card: "hibernating now". */
  now: string;
}

export function actionWords(action: string | undefined | null): IActionWords {
  return action === 'hibernate'
    ? { noun: __('hibernation'), now: __('hibernating now') }
    : { noun: __('shutdown'), now: __('shutting down now') };
}

/** A kernel's or lease's GPU state (or a move under way) in a word or two: "hibernated". */
export function stateWord(state: string | null | undefined): string {
  switch (state) {
    case 'active':
      return __('active');
    case 'running':
      return __('running');
    case 'hibernating':
      return __('hibernating');
    case 'hibernated':
      return __('hibernated');
    case 'no_gpu_yet':
      return __('no GPU yet');
    case 'resuming':
      return __('resuming');
    case 'queued':
      return __('queued');
    case 'released':
      return __('released');
    case 'evicting':
      return __('hibernated, to be shut down');
    case 'stopping':
      return __('shutting down');
    case 'failed':
      return __('failed');
    default:
      return __('unknown state (%1)', String(state ?? ''));
  }
}

/** A journal kind (or an action) as the decision log and the history write it. */
export function kindWord(kind: string): string {
  switch (kind) {
    case 'warned':
      return __('warned');
    case 'snoozed':
      return __('kept alive');
    case 'culled':
    case 'shutdown':
      return __('shut down');
    case 'hibernate':
      return __('hibernate');
    case 'resume':
      return __('resume');
    case 'hibernated':
      return __('hibernated');
    case 'released':
      return __('released');
    case 'resumed':
      return __('resumed');
    case 'refused':
      return __('refused');
    case 'reclaimed':
      return __('reclaimed');
    case 'queued':
      return __('queued');
    case 'over_memory':
      return __('over its memory');
    case 'release':
      return __('release');
    case 'start':
      return __('start');
    case 'requested':
      return __('asked by an admin');
    default:
      return __('other (%1)', kind.replace(/_/g, ' '));
  }
}

/**
 * Words from elsewhere (the server's message, an unknown kind) as a sentence: a capital first
 * letter and a full stop at the end.
 */
export function sentence(text: string): string {
  const trimmed = text.trim();
  if (!trimmed) {
    return trimmed;
  }
  const capital = trimmed.charAt(0).toUpperCase() + trimmed.slice(1);
  return /[.!?…]$/.test(capital) ? capital : `${capital}.`;
}

/* ---- reservations: room the admin keeps for a group in a window ------------------------------ */

/** What a reservation keeps: "160 GiB", "1 GPU", "2 GPUs and 40 GiB". */
export function amountWords(
  memory: number | null | undefined,
  gpus: number | null | undefined
): string {
  const whole = gpus ? _n('%1 GPU', '%1 GPUs', gpus) : '';
  const bytes = memory ? formatBytes(memory) : '';
  if (whole && bytes) {
    return __('%1 and %2', whole, bytes);
  }
  return whole || bytes || __('some GPU room');
}

/** A reservation's phase in a word or two: "open", "making room". */
export function phaseWord(phase: string): string {
  switch (phase) {
    case 'before':
      return __('upcoming');
    case 'making_room':
      return __('making room');
    case 'open':
      return __('open');
    case 'after':
      return __('over');
    default:
      return __('unknown phase (%1)', phase.replace(/_/g, ' '));
  }
}

/** Its window as one reads it beside `now`: the end said on its own day ("from 10:00 to 12:00"). */
function span(r: IReservation, now: number): { from: string; to: string; until: string } {
  return {
    from: formatWhen(r.start, now),
    to: formatWhen(r.end, r.start),
    until: formatWhen(r.end, now)
  };
}

/**
 * A reservation in a few words, for the status bar, the launcher and the panel: to a member "ML 101
 * lab: 160 GiB reserved until 12:00" (before its window: "from 10:00 to 12:00"), to others "160 GiB
 * reserved for ML 101 lab until 12:00".
 */
export function reservationWords(r: IReservation, now: number): string {
  const amount = amountWords(r.memory, r.gpus);
  const t = span(r, now);
  const open = r.phase === 'open';
  if (r.member) {
    return open
      ? __('%1: %2 reserved until %3', r.name, amount, t.until)
      : __('%1: %2 reserved from %3 to %4', r.name, amount, t.from, t.to);
  }
  return open
    ? __('%1 reserved for %2 until %3', amount, r.name, t.until)
    : __('%1 reserved for %2 from %3 to %4', amount, r.name, t.from, t.to);
}

/**
 * A reservation as a whole sentence (a tooltip, the panel's list): for members that the room is
 * theirs first; for others when the room is kept from them, and whether they may borrow it.
 */
export function reservationSentence(r: IReservation, now: number): string {
  const amount = amountWords(r.memory, r.gpus);
  const t = span(r, now);
  if (r.member) {
    return r.phase === 'open'
      ? __(
          '%1: %2 reserved for you and your group until %3; you go first.',
          r.name,
          amount,
          t.until
        )
      : __('%1: %2 reserved for you and your group from %3 to %4.', r.name, amount, t.from, t.to);
  }
  switch (r.phase) {
    case 'open':
      return r.borrowing
        ? __(
            'The pool keeps %1 for %2 until %3; you may borrow what its members leave unused, until one of them needs it.',
            amount,
            r.name,
            t.until
          )
        : __('The pool keeps %1 for %2 until %3.', amount, r.name, t.until);
    case 'making_room':
      return __(
        'The pool keeps %1 for %2 from %3 to %4, and is making that room now.',
        amount,
        r.name,
        t.from,
        t.to
      );
    default:
      return __('The pool keeps %1 for %2 from %3 to %4.', amount, r.name, t.from, t.to);
  }
}

/**
 * Why a kernel gives its room back, after "its GPU room is": "reserved for ML 101 lab from 10:00"
 * (before the window), "reserved for ML 101 lab until 12:00, and a member needs it" (in the window,
 * where the kernel borrowed the room); "reserved for others" where the reservation is not known here.
 */
export function reservedFor(r: IReservation | null, now: number): string {
  if (!r) {
    return __('reserved for others');
  }
  const t = span(r, now);
  return r.phase === 'open'
    ? __('reserved for %1 until %2, and a member needs it', r.name, t.until)
    : __('reserved for %1 from %2', r.name, t.from);
}

/** What a kernel that borrowed reserved room is told (its card, its notebook's toolbar). */
export function borrowedWords(r: IReservation | null, now: number): string {
  return r
    ? __(
        'Borrowed from the room reserved for %1 until %2: it may be hibernated, its variables kept, with a warning when a member needs the room.',
        r.name,
        formatWhen(r.end, now)
      )
    : __(
        'Borrowed from room reserved for others: it may be hibernated, its variables kept, with a warning when a member needs the room.'
      );
}

/** A line of the status bar's tooltip: which kernel borrowed reserved room, and what that means. */
export function borrowedLine(who: string, r: IReservation | null, now: number): string {
  return r
    ? __(
        '%1 runs on room borrowed from %2 until %3: it may be hibernated, its variables kept, when a member needs it.',
        who,
        r.name,
        formatWhen(r.end, now)
      )
    : __(
        '%1 runs on room borrowed from a reservation: it may be hibernated, its variables kept, when a member needs it.',
        who
      );
}

/**
 * Where a reservation stands now, for the admin's list: what it does now and what comes next ("open
 * until 12:00: members first; others may borrow from 10:10", "making room: opens at 10:00").
 */
export function reservationNow(r: IReservation, now: number): string {
  const t = span(r, now);
  const lead = r.lead ?? 0;
  switch (r.phase) {
    case 'open':
      return r.borrowing
        ? __('open until %1: others may borrow what members leave unused', t.until)
        : __(
            'open until %1: members first; others may borrow from %2',
            t.until,
            formatWhen(r.start + lead, now)
          );
    case 'making_room':
      return __('making room: the kernels of non-members give it back; opens at %1', t.from);
    case 'before':
      return __(
        'next from %1 to %2; making room from %3',
        t.from,
        t.to,
        formatWhen(r.start - lead, now)
      );
    default:
      return __('over since %1', formatWhen(r.end, now));
  }
}
