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

import { __ } from './i18n';

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
