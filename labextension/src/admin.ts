/**
 * From GET pool and GET pool/telemetry to what the admin dashboard shows: the
 * GPU table, the stacked series of each GPU's plots, the lease table with its
 * actions, the queue, everyone's GPU time and the filterable decision log.
 *
 * Pure functions, unit-tested; dashboard.tsx lays them out.
 */

import {
  baseName,
  formatBytes,
  formatClockSeconds,
  formatDuration,
  formatHours,
  formatPercent,
  gpuShortName,
  kernelName,
  plainNote,
  sliceWords
} from './format';
import { __ } from './i18n';
import { kindWord, reasonPhrase, stateWord } from './words';
import type {
  AdminAction,
  IBudget,
  IPool,
  IPoolLease,
  IProfile,
  IRecent,
  ITelemetry
} from './types';
import { IReservationRow, reservationRows } from './reservations';
import { budgetShare, NEAR_QUOTA } from './view';

const GiB = 1024 ** 3;

export interface IGpuRow {
  uuid: string;
  name: string;
  label: string;
  declared: boolean;
  memoryText: string;
  fraction: number;
  slices: string;
  utilization: string;
}

export interface ILeaseRow {
  id: string;
  kernelId: string;
  owner: string;
  notebook: string;
  path: string;
  /** The profile as the launcher names it ("Python 3 · GPU 20 GiB"); its id where unknown here. */
  profile: string;
  profileId: string;
  slice: string;
  gpu: string;
  state: string;
  /** It borrowed room a reservation keeps for others ("borrowed from ML 101 lab"), else "". */
  borrowed: string;
  age: string;
  idle: string;
  here: boolean;
  actions: Array<{ action: AdminAction; label: string; title: string }>;
}

export interface IQueueRow {
  position: number;
  owner: string;
  /** The notebook that waits ("–" where the server gave no name). */
  notebook: string;
  what: string;
  profile: string;
  waiting: string;
  /** Why it is where it is, in the server's words, where sharing orders the queue (else ""). */
  why: string;
}

export interface IBudgetRow {
  user: string;
  scope: string;
  text: string;
  fraction: number;
  level: 'ok' | 'near' | 'over';
  resets: string;
}

export interface IDecisionRow {
  key: string;
  at: number;
  time: string;
  user: string;
  notebook: string;
  profile: string;
  profileId: string;
  action: string;
  kind: string;
  reason: string;
  rule: string;
  dryRun: boolean;
  message: string;
}

export interface IDashboardView {
  note: string;
  dryRun: boolean;
  declared: boolean;
  gpus: IGpuRow[];
  leases: ILeaseRow[];
  queue: IQueueRow[];
  budgets: IBudgetRow[];
  decisions: IDecisionRow[];
  reservations: IReservationRow[];
}

function leaseSlice(l: IPoolLease): string {
  if (l.whole || l.memory === null) {
    return l.gpu_count && l.gpu_count > 1 ? __('%1 whole GPUs', l.gpu_count) : __('whole GPU');
  }
  return formatBytes(l.memory) + (l.sm_percent ? ` · ${l.sm_percent}%` : '');
}

function leaseState(l: IPoolLease): string {
  if (l.phase) {
    return stateWord(l.phase);
  }
  if (l.state === 'hibernated' && l.reason === 'first_cell') {
    // Started without a slice (slice_at: first-cell): it never held one, nothing was put to sleep.
    return stateWord('no_gpu_yet');
  }
  return stateWord(l.state === 'active' && l.execution_state === 'busy' ? 'running' : l.state);
}

/** "6.2 h of 10 h this week" */
export function budgetUse(b: IBudget): string {
  const used = formatHours(b.used_hours);
  const limit = formatHours(b.gpu_hours);
  switch (b.period) {
    case 'day':
      return __('%1 of %2 today', used, limit);
    case 'month':
      return __('%1 of %2 this month', used, limit);
    default: // the server's default period, and its only other one
      return __('%1 of %2 this week', used, limit);
  }
}

/** A profile id -> its launcher name, from GET me's profiles (the id where this server lacks it). */
export function profileNamer(profiles: ReadonlyArray<IProfile> = []): (id: string) => string {
  const names = new Map(profiles.map(p => [p.name, p.launcher_name]));
  return id => names.get(id) ?? id;
}

const ADMIN_ACTIONS: AdminAction[] = ['release', 'hibernate', 'shutdown'];

function adminActions(l: IPoolLease): ILeaseRow['actions'] {
  const allowed = l.actions ?? [];
  const where = (what: string) =>
    l.here
      ? what
      : __(
          '%1 (it runs in another Jupyter server: that server carries it out at its next pass)',
          what
        );
  return ADMIN_ACTIONS.filter(a => allowed.includes(a)).map(action => {
    switch (action) {
      case 'release':
        return {
          action,
          label: __('Release'),
          title: where(
            __('Give its GPU slice back as its rule says (hibernate where it can, else shut down)')
          )
        };
      case 'hibernate':
        return {
          action,
          label: __('Hibernate'),
          title: where(__('Hibernate it: its slice goes back, its variables are kept'))
        };
      default:
        return {
          action,
          label: __('Shut down'),
          title: where(__('Shut the kernel down: its variables are lost'))
        };
    }
  });
}

export function decisionRow(
  d: IRecent,
  i: number,
  name: (id: string) => string = id => id
): IDecisionRow {
  return {
    key: `${d.at}-${d.kernel_id}-${d.kind}-${i}`,
    at: d.at,
    time: formatClockSeconds(d.at),
    user: d.owner ?? '',
    // A refused start has no notebook yet on the server's side: "a new kernel", not its id.
    notebook:
      baseName(d.name ?? '') ||
      (d.kind === 'refused' ? __('a new kernel') : d.kernel_id ? d.kernel_id.slice(0, 8) : ''),
    profile: d.profile ? name(d.profile) : '',
    profileId: d.profile ?? '',
    action: d.action ?? '',
    kind: d.kind,
    reason: reasonPhrase(d.reason),
    rule: d.rule_label || d.rule || '',
    dryRun: !!d.dry_run,
    message: d.message
  };
}

export function dashboardView(
  pool: IPool,
  now: number,
  profiles: ReadonlyArray<IProfile> = []
): IDashboardView {
  const name = profileNamer(profiles);
  return {
    note: plainNote(pool.note),
    dryRun: !!pool.policy?.dry_run,
    declared: !!pool.declared,
    gpus: pool.gpus.map(g => ({
      uuid: g.uuid,
      name: gpuShortName(g.label),
      label: g.label,
      declared: g.source === 'declared',
      memoryText: __('%1 of %2 held', formatBytes(g.used_memory), formatBytes(g.memory)),
      fraction: g.memory ? Math.min(1, g.used_memory / g.memory) : 0,
      slices: String(g.slices) + (g.exclusive ? ` (${__('whole GPU')})` : ''),
      utilization: g.utilization === null ? __('no reading') : formatPercent(g.utilization)
    })),
    leases: leaseRows(pool, now, name),
    queue: queueRows(pool, now, name),
    budgets: budgetRows(pool),
    decisions: [...pool.decisions]
      .sort((a, b) => b.at - a.at)
      .map((d, i) => decisionRow(d, i, name)),
    reservations: reservationRows(pool, now)
  };
}

/** Every lease, by owner then age, with what an admin may do to it. */
function leaseRows(pool: IPool, now: number, name: (id: string) => string): ILeaseRow[] {
  const gpuName = new Map(pool.gpus.map(g => [g.uuid, gpuShortName(g.label)]));
  const leases = [...pool.leases].sort(
    (a, b) => a.owner.localeCompare(b.owner) || a.created - b.created
  );
  return leases.map(l => ({
    id: l.id,
    kernelId: l.kernel_id,
    owner: l.owner,
    notebook: kernelName(String(l.label ?? ''), l.kernel_id),
    path: String(l.label ?? ''),
    profile: name(l.profile),
    profileId: l.profile,
    slice: leaseSlice(l),
    gpu: l.gpus.length ? l.gpus.map(u => gpuName.get(u) ?? u.slice(0, 12)).join('+') : '–',
    state: leaseState(l),
    // It holds room a reservation keeps for others (while active): taken back when a member needs it.
    borrowed:
      l.borrowed?.length && l.state === 'active'
        ? __('borrowed from %1', l.borrowed.join(', '))
        : '',
    age: formatDuration(now - l.created),
    idle:
      l.execution_state === 'busy'
        ? __('busy')
        : l.idle_since
          ? formatDuration(now - l.idle_since)
          : '–',
    here: !!l.here,
    actions: adminActions(l)
  }));
}

/** Who waits, first first, and why each is where it is where sharing orders the queue. */
function queueRows(pool: IPool, now: number, name: (id: string) => string): IQueueRow[] {
  return [...pool.queue]
    .sort((a, b) => a.position - b.position)
    .map(w => ({
      position: w.position,
      owner: w.owner,
      notebook: baseName(w.label ?? '') || '–',
      what: w.lease_id ? __('resume') : __('start'),
      profile: w.slice ? __('%1 (%2)', name(w.profile), sliceWords(w.slice)) : name(w.profile),
      waiting: formatDuration(now - w.enqueued),
      why: w.why || ''
    }));
}

/** Everyone's GPU time against their budget, the closest to it first. */
function budgetRows(pool: IPool): IBudgetRow[] {
  return (pool.budgets ?? [])
    .map(b => {
      const share = budgetShare(b);
      return {
        user: b.user,
        scope: b.kind === 'user' ? __('own') : __('group %1', b.scope),
        text: budgetUse(b),
        fraction: Math.min(1, share),
        level: (share >= 1 ? 'over' : share >= NEAR_QUOTA ? 'near' : 'ok') as IBudgetRow['level'],
        resets: new Date(b.resets_at * 1000).toLocaleString()
      };
    })
    .sort((a, b) => b.fraction - a.fraction || a.user.localeCompare(b.user));
}

export interface IDecisionFilter {
  text: string;
  kind: string;
  user: string;
}

/** The decision log's rows that pass the filter: a kind, a user, and words anywhere in the row. */
export function filterDecisions(rows: IDecisionRow[], filter: IDecisionFilter): IDecisionRow[] {
  const words = filter.text.trim().toLowerCase().split(/\s+/).filter(Boolean);
  return rows.filter(r => {
    if (filter.kind && r.kind !== filter.kind) {
      return false;
    }
    if (filter.user && r.user !== filter.user) {
      return false;
    }
    const hay = [
      r.time,
      r.user,
      r.notebook,
      r.profile,
      r.profileId,
      r.kind,
      kindWord(r.kind),
      r.action,
      r.reason,
      r.rule,
      r.message
    ]
      .join(' ')
      .toLowerCase();
    return words.every(w => hay.includes(w));
  });
}

/** One stacked plot: a shared time axis, one series per kernel (values already stacked). */
export interface IStackedSeries {
  /** Unix seconds. */
  times: number[];
  series: Array<{
    key: string;
    label: string;
    /** The kernel's colour, the same in both plots of its GPU. */
    colour: string;
    /** This kernel's own value at each time (null: none). */
    values: Array<number | null>;
    /** The running total up to and including this kernel: what the plot draws. */
    stacked: number[];
    /** It holds its slice now (not hibernated, nor ended within the window). */
    holdsNow: boolean;
  }>;
  /** The axis maximum: the GPU's memory (GiB) or 100 (%). */
  max: number;
  /** The time axis: the whole window, whatever the readings (Unix seconds). */
  from: number;
  to: number;
  unit: 'GiB' | '%';
  /** For screen readers and tests: each kernel's latest value. */
  summary: string;
}

export interface IGpuPlots {
  uuid: string;
  name: string;
  /** No kernel on it has readings (a declared GPU): the memory plot shows what the slices hold. */
  slicesOnly: boolean;
  memory: IStackedSeries;
  utilization: IStackedSeries;
}

type Sample = [number, number | null, number | null];

/** A kernel's value at time `t`: its last sample then (a step), or null before its first. */
function stepAt(samples: Sample[], t: number, pick: (s: Sample) => number | null): number | null {
  let found: number | null = null;
  for (const s of samples) {
    if (s[0] > t) {
      break;
    }
    found = pick(s);
  }
  return found;
}

/** Categorical colours distinguishable in the light and the dark theme (Tableau 10). */
export const PALETTE = [
  '#4e79a7',
  '#f28e2b',
  '#59a14f',
  '#e15759',
  '#76b7b2',
  '#edc948',
  '#b07aa1',
  '#ff9da7',
  '#9c755f',
  '#bab0ac'
];

/**
 * A colour per kernel of a GPU: its own (from its id: the same at every refresh), or, where a kernel
 * before it has that one, the next free one: two kernels of a plot never share a colour.
 */
export function kernelColours(keys: ReadonlyArray<string>): string[] {
  const used = new Set<number>();
  return keys.map(key => {
    let hash = 0;
    for (let i = 0; i < key.length; i++) {
      hash = (hash * 31 + key.charCodeAt(i)) >>> 0;
    }
    let at = hash % PALETTE.length;
    for (let n = 0; n < PALETTE.length && used.has(at); n++) {
      at = (at + 1) % PALETTE.length;
    }
    used.add(at);
    return PALETTE[at];
  });
}

function stack(
  times: number[],
  rows: Array<{
    key: string;
    label: string;
    at: (t: number) => number | null;
    holdsNow: boolean;
  }>
): IStackedSeries['series'] {
  const running = times.map(() => 0);
  const colours = kernelColours(rows.map(r => r.key));
  return rows.map((r, i) => {
    const values = times.map(t => r.at(t));
    const stacked = values.map((v, i) => (running[i] += v ?? 0));
    return {
      key: r.key,
      label: r.label,
      colour: colours[i],
      values,
      stacked,
      holdsNow: r.holdsNow
    };
  });
}

/** A kernel's latest value, for the legend's "now": none once it is hibernated or ended. */
export function latestValue(series: IStackedSeries['series'][number]): number | null {
  if (!series.holdsNow) {
    return null;
  }
  const v = [...series.values].reverse().find(x => x !== null);
  return v === undefined ? null : v;
}

function summarize(series: IStackedSeries['series'], unit: string): string {
  const latest = series
    .map(s => {
      const v = latestValue(s);
      if (v === null) {
        return null;
      }
      return `${s.label} ${unit === '%' ? formatPercent(v) : `${Math.round(v * 10) / 10} GiB`}`;
    })
    .filter(Boolean);
  return latest.length ? latest.join('; ') : __('no readings');
}

/**
 * Per GPU, its kernels' memory and utilization over time, stacked: what each kernel's share of
 * the GPU was. Each kernel's readings hold until its next one (a step); its memory is the reading
 * where there is one, else what its slice holds. A kernel without readings (another server's, or
 * any on a declared GPU) holds its slice from when it took it until now.
 */
export function gpuPlots(telemetry: ITelemetry): IGpuPlots[] {
  const start = telemetry.start ?? telemetry.now - telemetry.window;
  type Kernel = ITelemetry['kernels'][number];
  const label = (k: Kernel) => {
    const name = `${k.owner} · ${baseName(k.name) || k.kernel_id.slice(0, 8)}`;
    // The legend says why a kernel's line is at 0 now (the table lists it as hibernated, or not at all).
    return k.state === 'hibernated'
      ? __('%1 (hibernated)', name)
      : k.state === 'ended'
        ? __('%1 (ended)', name)
        : name;
  };
  return telemetry.gpus.map(g => {
    const on = (k: Kernel) =>
      k.held ? k.held.some(([, , gpus]) => gpus.includes(g.uuid)) : k.gpus.includes(g.uuid);
    const kernels = telemetry.kernels.filter(on);
    const since = (k: Kernel) => Math.max(start, k.held_since ?? start);
    // Whether `k` held its slice on this GPU at `t`: not before it took it, nor once hibernated or ended.
    const holds = (k: Kernel, t: number) =>
      k.held
        ? k.held.some(
            ([from, until, gpus]) =>
              gpus.includes(g.uuid) && t >= from && (until === null || t < until)
          )
        : t >= since(k);
    const all = [telemetry.now];
    for (const k of kernels) {
      // Its readings' times, or (none) when it took its slice, unless its holds say when.
      all.push(...(k.samples.length || k.held ? k.samples.map(s => s[0]) : [since(k)]));
      for (const [from, until, gpus] of k.held ?? []) {
        if (gpus.includes(g.uuid)) {
          all.push(Math.max(start, from));
          if (until !== null) {
            all.push(until); // where its line drops to 0
          }
        }
      }
    }
    const times = kernels.length ? [...new Set(all)].sort((a, b) => a - b) : [];
    const memoryAt = (k: Kernel) => (t: number) => {
      if (!holds(k, t)) {
        return null;
      }
      // What it holds: its slice, or (whole GPUs) this GPU's memory.
      const slice = k.whole
        ? g.memory / GiB
        : k.slice_memory === null
          ? null
          : k.slice_memory / GiB;
      if (!k.samples.length) {
        return slice;
      }
      const held = stepAt(k.samples, t, ([, m]) => (m === null ? -1 : m / GiB));
      return held === -1 ? slice : held; // a reading without memory: the slice
    };
    const memory = stack(
      times,
      kernels.map(k => ({
        key: k.kernel_id,
        label: label(k),
        at: memoryAt(k),
        holdsNow: holds(k, telemetry.now)
      }))
    );
    const utilization = stack(
      times,
      kernels.map(k => ({
        key: k.kernel_id,
        label: label(k),
        at: (t: number) => (holds(k, t) ? stepAt(k.samples, t, ([, , u]) => u) : null),
        holdsNow: holds(k, telemetry.now)
      }))
    );
    const axis = { from: start, to: telemetry.now };
    return {
      uuid: g.uuid,
      name: gpuShortName(g.label),
      slicesOnly: kernels.length > 0 && kernels.every(k => !k.samples.some(s => s[1] !== null)),
      memory: {
        times,
        series: memory,
        max: g.memory / GiB,
        unit: 'GiB',
        summary: summarize(memory, 'GiB'),
        ...axis
      },
      utilization: {
        times,
        series: utilization,
        max: 100,
        unit: '%',
        summary: summarize(utilization, '%'),
        ...axis
      }
    };
  });
}
