/**
 * From the server's state (GET me, GET pool) to what the widgets show.
 *
 * Pure functions of their arguments (the server time `now` included), so that
 * every label, colour level, countdown and button is unit-tested in Node and
 * the React widgets only lay them out.
 */

import {
  baseName,
  formatBytes,
  formatClock,
  formatCountdown,
  formatDuration,
  formatPercent,
  formatUsedOf,
  plural,
  reasonPhrase,
  sparklinePoints
} from './format';
import type {
  IDecision,
  IKernel,
  IMe,
  IPool,
  IPoolLease,
  IPoolWaiter,
  KernelAction
} from './types';

/** Memory use at or above this share of the quota turns the status item to "near". */
export const NEAR_QUOTA = 0.8;

/** The sparkline shows this many seconds of utilization. */
export const SPARKLINE_WINDOW = 300;

export type StatusLevel = 'loading' | 'off' | 'ok' | 'near' | 'warning';

export interface IStatusView {
  text: string;
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

/** How close the user is to their quota: the largest used share among the limited resources. */
export function quotaShare(me: IMe): number {
  const shares: number[] = [];
  if (me.quota.memory) {
    shares.push(me.usage.memory / me.quota.memory);
  }
  if (me.quota.kernels) {
    shares.push(me.usage.kernels / me.quota.kernels);
  }
  if (me.quota.sm_percent) {
    shares.push(me.usage.sm_percent / me.quota.sm_percent);
  }
  return shares.length ? Math.max(...shares) : 0;
}

/** The status bar item: "GPU 10/40 GiB · 37%", its colour level and its tooltip. */
export function statusView(
  me: IMe | null,
  error: string | null,
  now: number
): IStatusView {
  if (!me) {
    if (error) {
      return {
        text: 'no GPU pool',
        level: 'off',
        title: `No GPU pool on this server: ${error}`
      };
    }
    return { text: 'GPU …', level: 'loading', title: 'Reading the GPU pool…' };
  }
  if (!me.pool.enabled) {
    return {
      text: 'no GPU pool',
      level: 'off',
      title: `No GPU pool on this server: ${me.pool.note}`
    };
  }
  const util = meanUtilization(me.kernels);
  const text =
    `GPU ${formatUsedOf(me.usage.memory, me.quota.memory)}` +
    (util === null ? '' : ` · ${formatPercent(util)}`);

  const lines: string[] = [];
  const held = `You hold ${formatBytes(me.usage.memory)} of GPU memory in ${plural(me.usage.kernels, 'kernel')}`;
  const limits: string[] = [];
  if (me.quota.memory !== null) {
    limits.push(`${formatBytes(me.quota.memory)}`);
  }
  if (me.quota.kernels !== null) {
    limits.push(plural(me.quota.kernels, 'kernel'));
  }
  lines.push(limits.length ? `${held}; your quota is ${limits.join(', ')}.` : `${held}; no quota.`);
  if (util !== null) {
    lines.push(`GPU utilization of your kernels: ${formatPercent(util)}.`);
  }
  const warned = me.kernels.filter(k => k.warning);
  for (const k of warned) {
    lines.push(`${baseName(k.name)}: ${countdownText(k, now)}.`);
  }
  const queued = me.kernels.filter(k => k.state === 'queued');
  for (const k of queued) {
    lines.push(`${baseName(k.name)}: queued at position ${k.queue_position ?? '?'}.`);
  }
  lines.push(`Pool: ${me.pool.note}`);
  lines.push('Click to open the GPU panel.');

  let level: StatusLevel = 'ok';
  if (warned.length) {
    level = 'warning';
  } else if (quotaShare(me) >= NEAR_QUOTA || queued.length) {
    level = 'near';
  }
  return { text, level, title: lines.join('\n') };
}

export interface IActionView {
  action: KernelAction;
  label: string;
  title: string;
  /** Ask before doing it: it loses the kernel's state. */
  confirm: string | null;
}

export interface ICardView {
  kernelId: string;
  title: string;
  path: string;
  profile: string;
  sliceLabel: string;
  gpu: string;
  memory: {
    used: number | null;
    limit: number | null;
    /** 0..1 of the slice, or null when there is no reading or no limit. */
    fraction: number | null;
    text: string;
    /** Said beside the label: "no reading" where NVML has none (declared GPUs). */
    note: string;
  };
  utilization: {
    text: string;
    points: string;
    label: string;
  };
  state: { kind: string; label: string };
  countdown: {
    text: string;
    /** Why and what it costs, in our words; the server's sentence is `detail`. */
    message: string;
    detail: string;
    level: 'warning';
  } | null;
  actions: IActionView[];
}

export function countdownText(kernel: IKernel, now: number): string {
  const w = kernel.warning;
  if (!w) {
    return '';
  }
  const verb = w.action === 'hibernate' ? 'hibernates' : 'shuts down';
  const left = w.deadline - now;
  return left > 0
    ? `${verb} in ${formatCountdown(left)}`
    : `${w.action === 'hibernate' ? 'hibernating' : 'shutting down'} now`;
}

/** The line under a countdown: why, and what happens to the kernel. */
export function warningConsequence(kernel: IKernel): string {
  const w = kernel.warning;
  if (!w) {
    return '';
  }
  const why = reasonPhrase(w.reason);
  const what =
    w.action === 'hibernate'
      ? 'its GPU slice goes back to the pool, its variables are kept'
      : 'its GPU slice goes back to the pool, its variables are lost';
  return `${why.charAt(0).toUpperCase()}${why.slice(1)}: ${what}.`;
}

export function stateView(kernel: IKernel, now: number): { kind: string; label: string } {
  switch (kernel.state) {
    case 'active': {
      const exec = kernel.execution_state;
      if (exec === 'busy') {
        return { kind: 'running', label: 'running' };
      }
      if (exec === 'starting') {
        return { kind: 'starting', label: 'starting' };
      }
      const kept =
        kernel.snoozed_until && kernel.snoozed_until > now
          ? ` · kept alive until ${formatClock(kernel.snoozed_until)}`
          : '';
      if (kernel.idle_since) {
        return {
          kind: 'idle',
          label: `idle since ${formatClock(kernel.idle_since)} (${formatDuration(now - kernel.idle_since)})${kept}`
        };
      }
      return { kind: 'idle', label: `idle${kept}` };
    }
    case 'hibernating':
      return { kind: 'hibernating', label: 'hibernating: moving GPU memory to host RAM…' };
    case 'hibernated':
      return {
        kind: 'hibernated',
        label: 'hibernated: GPU slice given back, variables kept (Resume or run a cell)'
      };
    case 'resuming':
      return { kind: 'resuming', label: 'resuming: taking a GPU slice again…' };
    case 'queued':
      return {
        kind: 'queued',
        label: `queued at position ${kernel.queue_position ?? '?'}: waiting for a free slice`
      };
    case 'released':
      return { kind: 'released', label: 'released: no GPU held' };
    default:
      return { kind: String(kernel.state), label: String(kernel.state) };
  }
}

const ACTION_ORDER: KernelAction[] = ['snooze', 'release', 'resume', 'shutdown'];

export function actionViews(kernel: IKernel): IActionView[] {
  const views: IActionView[] = [];
  for (const action of ACTION_ORDER) {
    if (!(kernel.actions ?? []).includes(action)) {
      continue;
    }
    switch (action) {
      case 'snooze': {
        const w = kernel.warning;
        views.push({
          action,
          label: 'Keep alive',
          title: w
            ? `Postpone the ${w.action === 'hibernate' ? 'hibernation' : 'shutdown'} by ${formatDuration(w.snooze_seconds)} (${plural(w.snoozes_left, 'snooze')} left)`
            : 'Postpone the idle timeout: count the kernel as active now',
          confirm: null
        });
        break;
      }
      case 'release': {
        const hibernates = kernel.release_action === 'hibernate';
        views.push({
          action,
          label: 'Release GPU now',
          title: hibernates
            ? 'Hibernate now: give the GPU slice back and keep the variables in host memory'
            : 'Shut the kernel down now to give its GPU slice back (its variables are lost)' +
              (kernel.hibernate_unavailable ? `; it cannot hibernate: ${kernel.hibernate_unavailable}` : ''),
          confirm: hibernates
            ? null
            : `Shut down ${baseName(kernel.name) || 'this kernel'} to give its GPU slice back? Its variables will be lost.`
        });
        break;
      }
      case 'resume':
        views.push({
          action,
          label: 'Resume',
          title: 'Take a GPU slice again and restore the kernel’s GPU memory',
          confirm: null
        });
        break;
      case 'shutdown':
        views.push({
          action,
          label: 'Shut down',
          title: 'Shut the kernel down (its variables are lost)',
          confirm: `Shut down ${baseName(kernel.name) || 'this kernel'}? Its variables will be lost.`
        });
        break;
    }
  }
  return views;
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

export function cardView(given: IKernel, now: number): ICardView {
  const kernel = complete(given);
  const sliceLabel = kernel.slice?.label ?? '';
  const limit = kernel.memory_limit ?? kernel.slice?.memory ?? null;
  const used = kernel.memory_used;
  const holdsGpu = kernel.gpus.length > 0 && !['hibernated', 'queued', 'released'].includes(kernel.state);
  let memoryText: string;
  let memoryNote = '';
  if (!holdsGpu) {
    memoryText = limit === null ? 'none held' : `0 of ${formatBytes(limit)}`;
  } else if (used === null) {
    memoryText = limit === null ? '–' : `${formatBytes(limit)} slice`;
    memoryNote = 'no reading';
  } else {
    memoryText = limit === null ? formatBytes(used) : `${formatBytes(used)} of ${formatBytes(limit)}`;
  }
  const fraction =
    holdsGpu && used !== null && limit ? Math.min(1, Math.max(0, used / limit)) : holdsGpu ? null : 0;
  const util = kernel.utilization;
  const current = holdsGpu ? util?.current ?? null : null;
  const samples = util?.samples ?? [];
  const gpu = holdsGpu
    ? kernel.gpus.map(g => g.label).join(', ')
    : kernel.state === 'queued'
      ? 'waiting for a GPU'
      : 'no GPU held';
  return {
    kernelId: kernel.kernel_id,
    title: baseName(kernel.name) || `kernel ${kernel.kernel_id.slice(0, 8)}`,
    path: kernel.name,
    profile: kernel.profile_display_name || kernel.profile,
    sliceLabel,
    gpu,
    memory: { used: holdsGpu ? used : 0, limit, fraction, text: memoryText, note: memoryNote },
    utilization: {
      text: current === null ? 'no reading' : formatPercent(current),
      points: sparklinePoints(samples, now, SPARKLINE_WINDOW, 100, 24),
      label:
        current === null
          ? 'GPU utilization: no reading'
          : `GPU utilization ${formatPercent(current)} now; last ${formatDuration(SPARKLINE_WINDOW)}: ` +
            summarize(samples.filter(([t]) => t >= now - SPARKLINE_WINDOW).map(([, p]) => p))
    },
    state: stateView(kernel, now),
    countdown: kernel.warning
      ? {
          text: countdownText(kernel, now),
          message: warningConsequence(kernel),
          detail: kernel.warning.message,
          level: 'warning'
        }
      : null,
    actions: actionViews(kernel)
  };
}

function summarize(values: number[]): string {
  if (!values.length) {
    return 'no samples';
  }
  return `min ${formatPercent(Math.min(...values))}, max ${formatPercent(Math.max(...values))}`;
}

/** The panel's header: the user's quota use, one bar per limited resource. */
export interface IQuotaBar {
  label: string;
  text: string;
  fraction: number | null;
  level: 'ok' | 'near' | 'over';
}

export function quotaBars(me: IMe): IQuotaBar[] {
  const level = (f: number): IQuotaBar['level'] => (f > 1 ? 'over' : f >= NEAR_QUOTA ? 'near' : 'ok');
  const bars: IQuotaBar[] = [];
  const mem = me.quota.memory;
  bars.push({
    label: 'GPU memory',
    text: mem === null ? `${formatBytes(me.usage.memory)} (no quota)` : `${formatBytes(me.usage.memory)} of ${formatBytes(mem)}`,
    fraction: mem ? Math.min(1, me.usage.memory / mem) : null,
    level: mem ? level(me.usage.memory / mem) : 'ok'
  });
  const k = me.quota.kernels;
  bars.push({
    label: 'GPU kernels',
    text: k === null ? `${me.usage.kernels} (no quota)` : `${me.usage.kernels} of ${k}`,
    fraction: k ? Math.min(1, me.usage.kernels / k) : null,
    level: k ? level(me.usage.kernels / k) : 'ok'
  });
  if (me.quota.sm_percent !== null) {
    bars.push({
      label: 'SM share',
      text: `${me.usage.sm_percent}% of ${me.quota.sm_percent}%`,
      fraction: me.quota.sm_percent ? Math.min(1, me.usage.sm_percent / me.quota.sm_percent) : null,
      level: me.quota.sm_percent ? level(me.usage.sm_percent / me.quota.sm_percent) : 'ok'
    });
  }
  return bars;
}

/** The notebook toolbar's slice indicator for the kernel with this id. */
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
  const slice = k.slice?.label ? `GPU ${k.slice.label}` : k.profile_display_name || k.profile;
  const gpuShort = k.gpus.map(g => g.label.split(' · ')[0]).join('+');
  let text: string;
  switch (k.state) {
    case 'active':
      text = gpuShort ? `${slice} · ${gpuShort}` : slice;
      break;
    case 'queued':
      text = `${slice} · queued #${k.queue_position ?? '?'}`;
      break;
    default:
      text = `${slice} · ${k.state}`;
  }
  const title =
    `This kernel holds a GPU slice of profile ${k.profile_display_name || k.profile}` +
    (k.slice?.label ? ` (${k.slice.label}${k.isolation ? `, ${k.isolation} isolation` : ''})` : '') +
    (k.gpus.length ? ` on ${k.gpus.map(g => g.label).join(', ')}` : '') +
    `; state: ${stateView(k, me.now).label}. Click to open the GPU panel.`;
  return { visible: true, text, title, kind: k.state };
}

/** The admins' view of the whole pool. */
export interface IPoolView {
  note: string;
  gpus: Array<{
    uuid: string;
    label: string;
    memoryText: string;
    fraction: number;
    slices: string;
    utilization: string;
    exclusive: boolean;
  }>;
  owners: Array<{ owner: string; memoryText: string; leases: Array<{ id: string; text: string; state: string }> }>;
  queue: Array<{ position: number; text: string }>;
  decisions: Array<{ key: string; when: string; text: string; dryRun: boolean }>;
  dryRun: boolean;
}

export function poolView(pool: IPool, now: number): IPoolView {
  const byOwner = new Map<string, IPoolLease[]>();
  for (const lease of pool.leases) {
    const list = byOwner.get(lease.owner) ?? [];
    list.push(lease);
    byOwner.set(lease.owner, list);
  }
  const gpuName = new Map(pool.gpus.map(g => [g.uuid, g.label.split(' · ')[0]]));
  const leaseText = (l: IPoolLease) =>
    [
      l.label ? baseName(String(l.label)) : `kernel ${l.kernel_id.slice(0, 8)}`,
      l.profile,
      l.memory === null ? 'whole GPU' : formatBytes(l.memory) + (l.sm_percent ? ` · ${l.sm_percent}% SM` : ''),
      l.gpus.length ? l.gpus.map(u => gpuName.get(u) ?? u.slice(0, 12)).join('+') : 'no GPU',
      `for ${formatDuration(now - l.created)}`
    ].join(' · ');
  const waiterText = (w: IPoolWaiter) =>
    `${w.owner} · ${w.profile}${w.slice ? ` (${w.slice})` : ''} · ${w.lease_id ? 'resume' : 'start'} · waiting ${formatDuration(now - w.enqueued)}`;
  const decisions = [...pool.decisions].sort((a, b) => b.at - a.at).slice(0, 20);
  return {
    note: pool.note,
    gpus: pool.gpus.map(g => ({
      uuid: g.uuid,
      label: g.label,
      memoryText: `${formatBytes(g.used_memory)} of ${formatBytes(g.memory)} in ${plural(g.slices, 'slice')}`,
      fraction: g.memory ? Math.min(1, g.used_memory / g.memory) : 0,
      slices: plural(g.slices, 'slice'),
      utilization: formatPercent(g.utilization),
      exclusive: g.exclusive
    })),
    owners: [...byOwner.entries()]
      .sort(([a], [b]) => a.localeCompare(b))
      .map(([owner, leases]) => ({
        owner,
        memoryText: formatBytes(leases.reduce((s, l) => s + (l.memory ?? 0), 0)),
        leases: leases.map(l => ({ id: l.id, text: leaseText(l), state: l.state }))
      })),
    queue: [...pool.queue].sort((a, b) => a.position - b.position).map(w => ({ position: w.position, text: waiterText(w) })),
    decisions: decisions.map((d: IDecision, i) => ({
      key: `${d.at}-${d.kernel_id}-${d.kind}-${i}`,
      when: formatClock(d.at),
      text: `${d.kind}${d.owner ? ` · ${d.owner}` : ''}${d.reason ? ` · ${d.reason}` : ''}: ${d.message}`,
      dryRun: !!d.dry_run
    })),
    dryRun: !!pool.policy?.dry_run
  };
}
