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
  | 'stopping'
  | 'released'
  | 'no_gpu_yet';

export type KernelAction = 'snooze' | 'release' | 'resume' | 'shutdown';

/** What an admin may do to any lease from the dashboard. */
export type AdminAction = 'release' | 'hibernate' | 'shutdown';

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
  /** Reason `reserved`: the name of the reservation the kernel gives its room back for (else null). */
  reservation?: string | null;
}

/** When the policy will act on an idle kernel if it stays idle (no warning yet). */
export interface INextAction {
  action: CullAction;
  reason: string;
  at: number;
}

export interface IUtilization {
  current: number | null;
  /** [time, percent] pairs, oldest first. */
  samples: Array<[number, number | null]>;
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
  /**
   * Its notebook was opened or edited while it slept, so the server woke it before a cell
   * (POST kernels/{id}/hint); true until a cell runs. The UI says "waking up…" while it resumes.
   */
  woken_on_hint?: boolean;
  /**
   * Its rule puts it to sleep this many seconds after each cell (`hibernate_after_cell`), without a
   * warning: it holds its GPU slice only while cells run, and a cell wakes it. Null: it does not.
   */
  sleeps_after_cell?: number | null;
  warning: IWarning | null;
  next_action?: INextAction | null;
  /** A Keep alive holds off the idle policy until then. */
  snoozed_until?: number | null;
  can_hibernate?: boolean;
  hibernate_unavailable?: string | null;
  release_action?: CullAction;
  rule?: string;
  /** The rule as users read it: its name, or for a rule given none, whom it covers ("for everyone"). */
  rule_label?: string;
  here?: boolean;
  actions: KernelAction[];
  /**
   * While the kernel's pod starts (Kubernetes), what it is doing, in plain words ("Pulling image
   * jupyter/pytorch-notebook: 40 s"); null otherwise.
   */
  progress?: string | null;
  /**
   * While it holds room a reservation keeps for others and their window is open: the server's words
   * for it ("Borrowed from the room reserved for ML 101 lab until 12:00: …"); null otherwise.
   */
  borrowed?: string | null;
}

export interface IQueueEntry {
  position: number;
  kernel_id: string;
  profile: string;
  for: 'start' | 'resume' | string;
  name?: string;
  profile_display_name?: string;
  enqueued?: number;
  /**
   * Where the admin's sharing orders the queue (a fair queue, a reservation's members first), why it
   * is where it is, in the server's words ("3rd in the queue: group 'research' has used more than its
   * share lately (2.4x); 2 ahead are from groups under their share"); null first come, first served.
   */
  why?: string | null;
}

/** The phases of a reservation around its window (docs/admin.md, "Reservations"). */
export type ReservationPhase = 'before' | 'making_room' | 'open' | 'after';

/** One of the admin's reservations as GET me (and GET pool) lists it. */
export interface IReservation {
  name: string;
  phase: ReservationPhase | string;
  /** The window's occurrence it concerns (the current one, else the next). */
  start: number;
  end: number;
  /** Whether the user reading it may use it. */
  member: boolean;
  /** The room it keeps: bytes in all, and whole GPUs (null: none of that kind). */
  memory: number | null;
  gpus: number | null;
  /** GPU models it keeps its room on (glob patterns of GPU names); empty: any GPU. */
  models: string[];
  /** The server's own words for it (the UI writes its own from the fields above). */
  words?: string;
  /** Seconds before `start` from which it keeps its room (non-members' kernels give it back). */
  lead?: number;
  /** Non-members may borrow what members leave unused now. */
  borrowing?: boolean;
}

/** A reservation as the dashboard lists it: who it is for, and its window as the admin wrote it. */
export interface IPoolReservation extends IReservation {
  groups: string[];
  users: string[];
  window: string;
}

/** A journal entry: what happened to a kernel, and why. */
export interface IRecent {
  at: number;
  kind: string;
  kernel_id: string;
  name?: string;
  owner?: string | null;
  profile?: string | null;
  reason?: string;
  message: string;
  rule?: string | null;
  /** The rule as users read it (see IKernel.rule_label). */
  rule_label?: string | null;
  action?: string | null;
  note?: string | null;
  dry_run?: boolean;
  /** A hibernation or resume on declared GPUs: nothing was moved. */
  declared?: boolean;
  /** The kernel ended because its server stopped (a release at the server's exit, or a reclaim after). */
  with_server?: boolean;
}

export interface IGroup {
  name: string;
  quota: IQuota;
  usage: IUsage;
}

/** Where a user stands against their tightest GPU-hour budget. */
export interface IBudget {
  scope: string;
  kind: 'user' | 'member' | 'shared' | string;
  period: 'day' | 'week' | 'month' | string;
  gpu_hours: number;
  used_hours: number;
  rate: number;
  resets_at: number;
}

/** A profile as the launcher offers it, and whether it would start for this user now. */
export interface IProfile {
  name: string;
  display_name: string;
  launcher_name: string;
  description: string;
  slice_label: string;
  memory: number | null;
  sm_percent: number | null;
  whole: boolean;
  isolation: string;
  starts_now: boolean | null;
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
  budget?: IBudget | null;
  profiles?: IProfile[];
  /** The admin's reservations that are not over, as this user reads them. */
  reservations?: IReservation[];
}

export interface IPoolGpu {
  uuid: string;
  label: string;
  name: string;
  memory: number;
  source?: string;
  index?: number;
  used_memory: number;
  used_sm_percent: number;
  free_memory?: number;
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
  phase?: string;
  /** Why it is in its state ("first_cell": hibernated because it never held a slice: no GPU yet). */
  reason?: string;
  gpus: string[];
  memory: number | null;
  sm_percent: number | null;
  whole?: boolean;
  gpu_count?: number;
  created: number;
  label?: string;
  here?: boolean;
  idle_since?: number | null;
  execution_state?: string | null;
  memory_used?: number | null;
  utilization?: number | null;
  warning?: { reason: string; action: string; deadline: number; message: string } | null;
  actions?: AdminAction[];
  /** The reservations whose unused room it borrowed (their names). */
  borrowed?: string[];
}

export interface IPoolWaiter {
  position: number;
  owner: string;
  kernel_id: string;
  profile: string;
  slice?: string | null;
  lease_id?: string | null;
  label?: string;
  enqueued: number;
  /** Why it is where it is, where the admin's sharing orders the queue (see IQueueEntry.why). */
  why?: string | null;
  groups?: string[];
}

export interface IPoolBudget extends IBudget {
  user: string;
}

export interface IPool {
  now: number;
  note: string;
  declared?: boolean;
  gpus: IPoolGpu[];
  leases: IPoolLease[];
  queue: IPoolWaiter[];
  decisions: IRecent[];
  budgets?: IPoolBudget[];
  policy?: { dry_run: boolean; rules: unknown[] };
  /** Every reservation of the admin's, each where it stands now. */
  reservations?: IPoolReservation[];
}

/** GET pool/telemetry: readings over time, per GPU and per kernel. */
export interface ITelemetry {
  now: number;
  window: number;
  /** The window's start (now - window). */
  start?: number;
  gpus: Array<{
    uuid: string;
    label: string;
    memory: number;
    /** [time, percent] */
    utilization: Array<[number, number | null]>;
  }>;
  kernels: Array<{
    kernel_id: string;
    owner: string;
    name: string;
    profile: string;
    gpus: string[];
    /** Bytes the slice holds on each GPU: what the memory plot stacks where there is no reading. */
    slice_memory: number | null;
    /** Since when it holds its slice (a kernel without readings is drawn from then on). */
    held_since?: number;
    /** It holds whole GPUs: on each, the GPU's memory. */
    whole?: boolean;
    /** active, hibernated, or ended (within the window). */
    state?: string;
    /**
     * When it held its slice within the window, oldest first: [from, until (null: still), GPU uuids].
     * Outside these it holds nothing (hibernated, or ended), and is drawn at 0.
     */
    held?: Array<[number, number | null, string[]]>;
    /** [time, memory bytes or null, utilization percent or null] */
    samples: Array<[number, number | null, number | null]>;
  }>;
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
  declared?: boolean;
}

export const KERNEL_ACTION_SCHEMA = 'https://jupyter-gpu-pool.readthedocs.io/events/kernel-action';
