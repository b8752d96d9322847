/**
 * The pool's notifications as a function of the state.
 *
 * A toast stands for a fact that needs the user now: a warning with a deadline (GET me's), a refusal
 * of their own action, a loss of state. It is there while its fact holds and not a moment longer,
 * whatever order the polls and the pushed events arrive in: the NoticeBook collects what happened
 * (each happening once, pushed or polled, in the server's words enriched by the poll), and
 * `factsNow` judges every happening against the latest GET me, the newer happenings and what the
 * page knows of its notebooks. Everything else that happened is a record: the notification centre
 * keeps it without a toast, as the panel's "What happened" does, and so does a fact that no longer
 * holds. `placeToasts` keeps at most three toasts on screen. No DOM here: toasts.ts shows the result.
 */

import { formatWhen } from './format';
import { __ } from './i18n';
import { counted, explanation, kernelOf, NoticeType, recordLine, warningMessage } from './notices';
import type { IKernelActionEvent, IMe, IRecent } from './types';
import { canKeepAlive, pendingWarning } from './view';

/** At most this many of the pool's toasts on screen; the others are in the notification centre. */
export const MAX_ON_SCREEN = 3;

/** Seconds within which a pushed event and a polled `recent` entry are the same happening. */
const SAME_HAPPENING = 120;

/** Happenings the server reports that are worth a notification, by kind (event action or `recent` kind). */
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
 * Reasons never worth a notification: the user's own request, a kernel woken in advance as its
 * notebook was opened, or put back to sleep when no cell came (its card says so calmly), and a
 * kernel asleep between cells by its rule (it lost nothing; its card says a cell wakes it).
 */
const QUIET_REASONS = new Set(['user', 'hint', 'hint_unused', 'after_cell']);

/** What the page itself has to say: a failed action of the user's, a kernel JupyterLab could not start, a new kernel, a note. */
export type ClientKind = 'action_failed' | 'kernel_error' | 'new_kernel' | 'note';

/** Something that happened, once, however often the poll and the events report it. */
export interface IHappening {
  key: string;
  /** A `recent` kind or event action of the server's, or a ClientKind. */
  kind: string;
  kernelId: string;
  name?: string;
  reason?: string;
  action?: string;
  profile?: string;
  declared?: boolean;
  withServer?: boolean;
  /** The server's sentence, or the page's own (client kinds). */
  message: string;
  /** Server time. */
  at: number;
  /** The first GET me read after it: a refusal's advice (what would start now) is read from it. */
  seen: IMe | null;
  /** new_kernel: the kernel whose notebook it replaced. */
  replaces?: string;
}

export type FactNature = 'warning' | 'loss' | 'refusal' | 'prompt' | 'record';

/** A notification as it should be now. */
export interface IFact {
  /** Its identity: the first of the happenings it stands for (identical texts are one fact). */
  key: string;
  members: string[];
  kernelId: string;
  /** record: said in the notification centre only, never a toast. */
  nature: FactNature;
  type: NoticeType;
  message: string;
  /** What the notification centre keeps once it no longer holds; null: nothing (a warning). */
  record: string | null;
  /** When it arrived (server time): the older toast keeps its place on screen. */
  at: number;
  keepAlive: boolean;
  /** Release now: give the slice back at once to whoever waits. */
  release: boolean;
  /** Start a new kernel in the notebook whose kernel is gone. */
  newKernel: boolean;
  openPanel: boolean;
  runAll: boolean;
}

/** What the notifications are judged against. */
export interface IWorld {
  me: IMe | null;
  happenings: ReadonlyArray<IHappening>;
  /** Kernels whose notebook has another kernel now (the user started or picked one). */
  replaced: ReadonlySet<string>;
  /** Kernels on which a cell ran in this page. */
  ran: ReadonlySet<string>;
  /** Keys of the notifications the user closed: never again. */
  closed: ReadonlySet<string>;
  /** Keys of facts that stopped holding once: they are over (records), whatever comes after. */
  ended: ReadonlySet<string>;
}

const IN_SLEEP = ['hibernated', 'no_gpu_yet', 'queued', 'resuming'];

/** Warnings that offer Release now: the slice is wanted by someone else (a waiter, a reservation). */
const GIVE_BACK_NOW = new Set(['pressure', 'reserved']);

function kernelIn(me: IMe | null, kernelId: string) {
  return me?.kernels.find(k => k.kernel_id === kernelId);
}

/** What a happening is to the user: null, nothing to tell. */
function natureOf(h: IHappening, me: IMe | null): FactNature | null {
  switch (h.kind) {
    case 'action_failed':
    case 'kernel_error':
      return 'refusal';
    case 'new_kernel':
      return 'prompt';
    case 'note':
      return 'record';
    case 'culled':
    case 'reclaimed':
      return 'loss';
    case 'released':
      return h.withServer || h.action !== 'hibernate' ? 'loss' : 'record';
    case 'refused':
      return h.action === 'hibernate' && h.reason !== 'hibernation_failed' ? 'record' : 'refusal';
    case 'resumed': {
      // The wake of a kernel asleep between cells (its cell says so) or woken on a hint: no news.
      const k = kernelIn(me, h.kernelId);
      return k?.sleeps_after_cell || k?.woken_on_hint ? null : 'record';
    }
    default:
      return 'record';
  }
}

/** Whether a newer happening of the server's about the same kernel says what is true now. */
function superseded(h: IHappening, world: IWorld): boolean {
  return (
    !!h.kernelId &&
    world.happenings.some(
      o => o.kernelId === h.kernelId && o.at > h.at && o.key !== h.key && EXPLAINED.has(o.kind)
    )
  );
}

/** A refused start: its advice (what would start now) is read from GET me. */
function startRefusal(h: IHappening): boolean {
  return h.kind === 'refused' && !h.action && h.reason !== 'hibernation_failed';
}

/** A refused start's toast as it would read with `me`'s advice (what would start now). */
function startRefusalText(h: IHappening, me: IMe | null): string {
  return explanation('refused', h.name, h.reason, '', { me, profile: h.profile });
}

/** Whether a loss, refusal or prompt still holds. */
function holds(h: IHappening, nature: FactNature, world: IWorld): boolean {
  if (world.ended.has(h.key)) {
    return false;
  }
  const { me } = world;
  // The latest GET me is newer than the happening: its picture of the kernel is the truth.
  const fresh = me !== null && me.now >= h.at;
  const k = kernelIn(me, h.kernelId);
  switch (nature) {
    case 'loss':
      return !(
        world.replaced.has(h.kernelId) ||
        world.happenings.some(o => o.kind === 'new_kernel' && o.replaces === h.kernelId) ||
        // its notebook runs another GPU kernel now
        (fresh &&
          !!h.name &&
          !!me?.kernels.some(o => o.name === h.name && o.kernel_id !== h.kernelId))
      );
    case 'prompt':
      return !world.ran.has(h.kernelId);
    case 'refusal':
      if (h.kind === 'kernel_error') {
        return true;
      }
      if (startRefusal(h)) {
        // Its advice read from the GET me after it, while a fresh GET me would advise the same.
        return startRefusalText(h, h.seen) === startRefusalText(h, me);
      }
      if (superseded(h, world) || (fresh && !!h.kernelId && !k && h.kind !== 'action_failed')) {
        return false;
      }
      if (h.kind === 'refused' && (h.action === 'resume' || h.action === 'first_cell')) {
        return !fresh || (!!k && IN_SLEEP.includes(k.state));
      }
      return true;
    default:
      return false;
  }
}

/** The toast of a loss, refusal or prompt, in the words of now. */
function liveFact(h: IHappening, nature: FactNature, world: IWorld): IFact {
  const server = EXPLAINED.has(h.kind);
  const message =
    h.kind === 'new_kernel'
      ? newKernelMessage(h.name)
      : server
        ? explanation(h.kind, h.name, h.reason, h.message, {
            me: h.seen ?? world.me,
            profile: h.profile,
            declared: h.declared,
            action: h.action,
            withServer: h.withServer
          })
        : h.message;
  return {
    ...base(h, world),
    nature,
    type: nature === 'loss' ? 'warning' : nature === 'prompt' ? 'info' : 'error',
    message,
    newKernel: nature === 'loss',
    openPanel: server,
    runAll: nature === 'prompt'
  };
}

/** A new kernel after the pool shut the notebook's old one down: what it lacks, and Run all cells. */
export function newKernelMessage(path: string | undefined): string {
  return __(
    'A new kernel started for %1: the variables from before the shutdown are gone. Run your cells again from the top.',
    kernelOf(path).replace(/’s kernel$/, '')
  );
}

/** What the notification centre keeps of a happening. */
function recordOf(h: IHappening, world: IWorld): string {
  const at = formatWhen(h.at, world.me?.now ?? h.at);
  switch (h.kind) {
    case 'action_failed':
    case 'kernel_error':
    case 'note':
      return h.message;
    case 'new_kernel':
      return __(
        'At %1, a new kernel started for %2.',
        at,
        kernelOf(h.name).replace(/’s kernel$/, '')
      );
    default:
      return recordLine(h.kind, h.name, h.reason, at, {
        me: h.seen ?? world.me,
        profile: h.profile,
        declared: h.declared,
        action: h.action,
        withServer: h.withServer
      });
  }
}

function base(h: IHappening, world: IWorld): IFact {
  return {
    key: h.key,
    members: [h.key],
    kernelId: h.kernelId,
    nature: 'record',
    type: 'info',
    message: '',
    record: recordOf(h, world),
    at: h.at,
    keepAlive: false,
    release: false,
    newKernel: false,
    openPanel: false,
    runAll: false
  };
}

/** GET me's pending warnings, unless a happening newer than that GET me says the kernel moved on. */
function warningFacts(world: IWorld): IFact[] {
  const me = world.me;
  if (!me) {
    return [];
  }
  const facts: IFact[] = [];
  for (const k of me.kernels) {
    const w = pendingWarning(k);
    const movedOn = world.happenings.some(
      o =>
        o.kernelId === k.kernel_id && o.at > me.now && EXPLAINED.has(o.kind) && o.kind !== 'queued'
    );
    if (!w || w.deadline <= me.now || movedOn) {
      continue;
    }
    const keepAlive = canKeepAlive(k);
    // A new deadline, or no Keep alive left, is a new warning.
    const key = `warning:${k.kernel_id}:${Math.round(w.deadline)}:${keepAlive ? 'k' : 'n'}`;
    facts.push({
      key,
      members: [key],
      kernelId: k.kernel_id,
      nature: 'warning',
      type: 'warning',
      message: warningMessage(k, me.now, me.reservations),
      record: null,
      at: me.now,
      keepAlive,
      // Someone waits, or a reservation's member needs the room: give the slice back now, if they like.
      release: GIVE_BACK_NOW.has(w.reason) && (k.actions ?? []).includes('release'),
      newKernel: false,
      openPanel: true,
      runAll: false
    });
  }
  return facts;
}

/**
 * Every notification as it should be now: the toasts whose facts hold (identical texts as one,
 * counted), and the record of everything else that happened since the page opened.
 */
export function factsNow(world: IWorld): IFact[] {
  const facts = warningFacts(world).filter(f => !world.closed.has(f.key));
  const lost = new Set<string>();
  for (const h of [...world.happenings].sort((a, b) => a.at - b.at)) {
    if (world.closed.has(h.key) || (startRefusal(h) && h.seen === null)) {
      continue; // closed; or a refused start whose advice waits for the GET me after it
    }
    let nature = natureOf(h, world.me);
    if (nature === 'loss' && lost.has(h.kernelId)) {
      nature = 'record'; // told once: a reclaim after its cull is no second loss
    }
    if (nature === 'loss') {
      lost.add(h.kernelId);
    }
    if (nature === null) {
      continue;
    }
    facts.push(
      nature !== 'record' && holds(h, nature, world) ? liveFact(h, nature, world) : base(h, world)
    );
  }
  return merged(facts);
}

/** Identical texts as one notification, counted: five refused starts of one profile, "(5 times)". */
function merged(facts: IFact[]): IFact[] {
  const out: IFact[] = [];
  const byText = new Map<string, IFact>();
  for (const f of facts) {
    // A warning is its kernel's own (its buttons act on that kernel).
    const text =
      f.nature === 'warning'
        ? f.key
        : f.nature === 'record'
          ? `record:${f.record}`
          : `live:${f.message}`;
    const same = byText.get(text);
    if (same) {
      same.members.push(...f.members);
      continue;
    }
    const copy = { ...f, members: [...f.members] };
    byText.set(text, copy);
    out.push(copy);
  }
  for (const f of out) {
    f.message = counted(f.message, f.members.length);
    f.record = f.record === null ? null : counted(f.record, f.members.length);
  }
  return out;
}

/**
 * Which toasts are on screen: those already there stay while their facts hold; a new one takes a
 * free place; past MAX_ON_SCREEN a new warning (a deadline the user can still stop) takes the place
 * of the oldest other toast, and any other new one goes to the notification centre without a toast.
 * `demoted`: facts sent to the centre before, which never come back as toasts.
 */
export function placeToasts(
  facts: ReadonlyArray<IFact>,
  before: ReadonlyArray<string>,
  demoted: ReadonlySet<string>,
  max = MAX_ON_SCREEN
): { onScreen: string[]; demoted: string[] } {
  const live = facts.filter(f => f.nature !== 'record' && !demoted.has(f.key));
  const byKey = new Map(live.map(f => [f.key, f]));
  const onScreen = before.filter(key => byKey.has(key));
  const sent: string[] = [];
  const arrivals = live.filter(f => !onScreen.includes(f.key)).sort((a, b) => a.at - b.at);
  for (const f of arrivals) {
    if (onScreen.length < max) {
      onScreen.push(f.key);
      continue;
    }
    if (f.nature !== 'warning') {
      sent.push(f.key);
      continue;
    }
    const others = onScreen.filter(key => byKey.get(key)!.nature !== 'warning');
    const leaving = others.length ? others[0] : onScreen[0];
    onScreen.splice(onScreen.indexOf(leaving), 1);
    sent.push(leaving);
    onScreen.push(f.key);
  }
  return { onScreen, demoted: sent };
}

/** A happening from a `recent` entry or a pushed event. */
function happening(
  kind: string,
  kernelId: string,
  at: number,
  fields: Partial<IHappening>
): IHappening {
  return {
    key: `${kind}:${kernelId}:${Math.round(at)}`,
    kind,
    kernelId,
    at,
    message: '',
    seen: null,
    ...fields
  };
}

/**
 * What happened since the page opened, each happening once: a pushed event and the polled `recent`
 * entry of the same happening are one (the entry, the server's record, completes the event's words).
 */
export class NoticeBook {
  /**
   * @param since - server time from which happenings are new; older `recent` entries were
   *   explained before this page was opened (the panel lists them).
   */
  constructor(since: number) {
    this._since = since;
  }

  get me(): IMe | null {
    return this._me;
  }

  get happenings(): ReadonlyArray<IHappening> {
    return this._happenings;
  }

  /** A fresh GET me. */
  fromState(me: IMe): void {
    this._me = me;
    for (const k of me.kernels) {
      this._names.set(k.kernel_id, k.name);
    }
    for (const entry of me.recent) {
      if (
        entry.at > this._since &&
        EXPLAINED.has(entry.kind) &&
        !QUIET_REASONS.has(entry.reason ?? '')
      ) {
        this._fromRecent(entry);
      }
    }
    // The first GET me after a happening: a refusal's advice is read from it.
    this._happenings = this._happenings.map(h =>
      h.seen === null && me.now >= h.at ? { ...h, seen: me } : h
    );
  }

  /** A pushed kernel-action event (`now`: the server time it arrived). */
  fromEvent(event: IKernelActionEvent, now: number): void {
    if (!EXPLAINED.has(event.action) || event.dry_run || QUIET_REASONS.has(event.reason ?? '')) {
      return;
    }
    const told = this._happenings.some(
      o =>
        o.kind === event.action &&
        o.kernelId === event.kernel_id &&
        Math.abs(o.at - now) < SAME_HAPPENING &&
        (o.kind !== 'refused' || !o.profile || !event.profile || o.profile === event.profile)
    );
    if (told) {
      return; // polled first, or pushed twice
    }
    this._happenings = [
      ...this._happenings,
      happening(event.action, event.kernel_id, now, {
        name: this._names.get(event.kernel_id),
        reason: event.reason,
        profile: event.profile,
        declared: event.declared,
        message: event.message ?? '',
        withServer: event.reason === 'server_stopped'
      })
    ];
  }

  /** Something the page itself has to say (see ClientKind); `at`: server time. */
  add(kind: ClientKind, fields: Partial<IHappening> & { kernelId: string; at: number }): void {
    const key = `${kind}:${fields.kernelId}:${++this._count}`;
    this._happenings = [...this._happenings, { kind, message: '', seen: null, ...fields, key }];
  }

  private _fromRecent(entry: IRecent): void {
    const fields: Partial<IHappening> = {
      name: entry.name || this._names.get(entry.kernel_id),
      reason: entry.reason,
      action: entry.action ?? undefined,
      profile: entry.profile ?? undefined,
      declared: entry.declared,
      withServer: entry.with_server,
      message: entry.message
    };
    const like = (o: IHappening) =>
      o.kind === entry.kind &&
      o.kernelId === entry.kernel_id &&
      (o.kind !== 'refused' || !o.profile || !entry.profile || o.profile === entry.profile);
    if (
      this._happenings.some(
        o => like(o) && this._recorded.has(o.key) && Math.abs(o.at - entry.at) < 1
      )
    ) {
      return; // polled before
    }
    const pushed = this._happenings.find(
      o => like(o) && !this._recorded.has(o.key) && Math.abs(o.at - entry.at) < SAME_HAPPENING
    );
    // The server's record of a happening pushed before completes the event's words, and its time.
    const h = pushed
      ? { ...pushed, ...fields, at: entry.at }
      : happening(entry.kind, entry.kernel_id, entry.at, fields);
    this._happenings = pushed
      ? this._happenings.map(o => (o === pushed ? h : o))
      : [...this._happenings, h];
    this._recorded.add(h.key);
  }

  private _since: number;
  private _me: IMe | null = null;
  private _happenings: IHappening[] = [];
  private _names = new Map<string, string>();
  private _recorded = new Set<string>(); // happenings the server's `recent` has confirmed
  private _count = 0;
}
