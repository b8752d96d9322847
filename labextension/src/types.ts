/**
 * The server extension's REST payloads (docs/api.md), as TypeScript types.
 *
 * Times are Unix seconds (float), sizes are bytes. Fields may be added by the
 * server; the UI reads only what is listed here.
 */

export type KernelState =
  | 'active'
  | 'hibernating'
  | 'hibernated'
  | 'resuming'
  | 'queued'
  | 'released';

export type KernelAction = 'snooze' | 'release' | 'resume' | 'shutdown';

export type CullAction = 'hibernate' | 'shutdown';

export interface IQuota {
  memory: number | null;
  sm_percent: number | null;
  kernels: number | null;
}

export interface IUsage {
  memory: number;
  sm_percent: number;
  kernels: number;
}

export interface IPoolSummary {
  enabled: boolean;
  declared?: boolean;
  note: string;
  gpus?: number;
  memory_total?: number;
  memory_free?: number;
}

export interface ISlice {
  label: string;
  memory: number | null;
  sm_percent: number | null;
  whole: boolean;
  gpu_count: number;
}

export interface IGpuRef {
  uuid: string;
  label: string;
  source?: string;
}

export interface IWarning {
  action: CullAction;
  reason: string;
  message: string;
  deadline: number;
  snoozes_left: number;
  snooze_seconds: number;
}

export interface IUtilization {
  current: number | null;
  /** [time, percent] pairs, oldest first. */
  samples: Array<[number, number]>;
}

export interface IKernel {
  kernel_id: string;
  lease_id: string | null;
  name: string;
  profile: string;
  profile_display_name?: string;
  slice: ISlice | null;
  isolation?: string;
  gpus: IGpuRef[];
  state: KernelState;
  execution_state?: string | null;
  last_activity?: number | null;
  idle_since?: number | null;
  memory_used: number | null;
  memory_limit: number | null;
  utilization: IUtilization | null;
  queue_position: number | null;
  warning: IWarning | null;
  /** A Keep alive holds off the idle policy until then. */
  snoozed_until?: number | null;
  can_hibernate?: boolean;
  hibernate_unavailable?: string | null;
  release_action?: CullAction;
  actions: KernelAction[];
}

export interface IQueueEntry {
  position: number;
  kernel_id: string;
  profile: string;
  for: 'start' | 'resume' | string;
}

export interface IRecent {
  at: number;
  kind: string;
  kernel_id: string;
  name?: string;
  reason?: string;
  message: string;
}

export interface IGroup {
  name: string;
  quota: IQuota;
  usage: IUsage;
}

export interface IMe {
  now: number;
  user: string;
  admin: boolean;
  pool: IPoolSummary;
  quota: IQuota;
  usage: IUsage;
  groups: IGroup[];
  kernels: IKernel[];
  queue: IQueueEntry[];
  recent: IRecent[];
}

export interface IPoolGpu {
  uuid: string;
  label: string;
  name: string;
  memory: number;
  source?: string;
  used_memory: number;
  used_sm_percent: number;
  exclusive: boolean;
  slices: number;
  utilization: number | null;
}

export interface IPoolLease {
  id: string;
  owner: string;
  kernel_id: string;
  profile: string;
  state: string;
  gpus: string[];
  memory: number | null;
  sm_percent: number | null;
  created: number;
  label?: string;
  [key: string]: unknown;
}

export interface IPoolWaiter {
  position: number;
  owner: string;
  kernel_id: string;
  profile: string;
  slice?: string | null;
  lease_id?: string | null;
  enqueued: number;
  [key: string]: unknown;
}

export interface IDecision {
  at: number;
  kind: string;
  kernel_id: string;
  owner?: string;
  reason?: string;
  dry_run?: boolean;
  message: string;
}

export interface IPool {
  now: number;
  note: string;
  gpus: IPoolGpu[];
  leases: IPoolLease[];
  queue: IPoolWaiter[];
  decisions: IDecision[];
  policy?: { dry_run: boolean; rules: unknown[] };
}

/** An event of schema kernel-action (docs/api.md, "Events"). */
export interface IKernelActionEvent {
  action: string;
  kernel_id: string;
  user?: string;
  profile?: string;
  reason?: string;
  message?: string;
  deadline?: number;
  dry_run?: boolean;
  duration?: number;
  bytes?: number;
}

export const KERNEL_ACTION_SCHEMA =
  'https://jupyter-gpu-pool.readthedocs.io/events/kernel-action';
