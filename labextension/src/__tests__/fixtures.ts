/** Payloads shaped like docs/api.md's examples, and a screen of toasts, for the unit tests. */

import { factsNow, IFact, NoticeBook, placeToasts } from '../facts';
import type { IKernel, IMe, IPool, IProfile, ITelemetry } from '../types';

export const GiB = 1024 ** 3;
export const NOW = 1732270000;

/** A shutdown pending in two minutes, one snooze left. */
export const warning = {
  action: 'shutdown' as const,
  reason: 'idle',
  message: 'Idle for 28 min.',
  deadline: NOW + 120,
  snoozes_left: 1,
  snooze_seconds: 1800
};

export function kernel(overrides: Partial<IKernel> = {}): IKernel {
  return {
    kernel_id: '0b6f5f0e-1111-2222-3333-444455556666',
    lease_id: '6390aaaa',
    name: 'analysis/Untitled.ipynb',
    profile: 'gpu-10g',
    profile_display_name: 'GPU 10 GiB',
    slice: { label: '10 GiB', memory: 10 * GiB, sm_percent: null, whole: false, gpu_count: 1 },
    isolation: 'soft',
    gpus: [{ uuid: 'GPU-1', label: 'GPU 0 · NVIDIA H100 · 80 GiB (detected)', source: 'detected' }],
    state: 'active',
    execution_state: 'idle',
    last_activity: NOW - 1000,
    idle_since: NOW - 1000,
    memory_used: 3 * GiB,
    memory_limit: 10 * GiB,
    utilization: {
      current: 37,
      samples: [
        [NOW - 10, 35],
        [NOW - 5, 37]
      ]
    },
    queue_position: null,
    warning: null,
    can_hibernate: true,
    hibernate_unavailable: null,
    release_action: 'hibernate',
    actions: ['snooze', 'release', 'shutdown'],
    progress: null,
    ...overrides
  };
}

export function me(overrides: Partial<IMe> = {}): IMe {
  return {
    now: NOW,
    user: 'alice',
    admin: false,
    pool: { enabled: true, declared: true, note: '2 declared GPU(s) from the inventory', gpus: 2 },
    quota: { memory: 40 * GiB, sm_percent: null, kernels: 4 },
    usage: { memory: 10 * GiB, sm_percent: 0, kernels: 1 },
    groups: [],
    kernels: [kernel()],
    queue: [],
    recent: [],
    ...overrides
  };
}

export function pool(overrides: Partial<IPool> = {}): IPool {
  return {
    now: NOW,
    note: '2 declared GPU(s)',
    gpus: [
      {
        uuid: 'GPU-1',
        label: 'GPU 0 · Demo · 40 GiB (declared)',
        name: 'Demo',
        memory: 40 * GiB,
        source: 'declared',
        used_memory: 20 * GiB,
        used_sm_percent: 50,
        exclusive: false,
        slices: 2,
        utilization: null
      }
    ],
    leases: [
      {
        id: 'L1',
        owner: 'bob',
        kernel_id: 'k-bob-1',
        profile: 'gpu-10g',
        state: 'active',
        gpus: ['GPU-1'],
        memory: 10 * GiB,
        sm_percent: null,
        created: NOW - 600,
        label: 'b.ipynb'
      },
      {
        id: 'L2',
        owner: 'alice',
        kernel_id: 'k-alice-1',
        profile: 'gpu-20g-50',
        state: 'active',
        gpus: ['GPU-1'],
        memory: 10 * GiB,
        sm_percent: 50,
        created: NOW - 60,
        label: 'x/a.ipynb'
      },
      {
        id: 'L3',
        owner: 'bob',
        kernel_id: 'k-bob-2',
        profile: 'gpu-10g',
        state: 'hibernated',
        gpus: [],
        memory: 10 * GiB,
        sm_percent: null,
        created: NOW - 7200,
        label: ''
      }
    ],
    queue: [
      {
        position: 2,
        owner: 'carol',
        kernel_id: 'k-c2',
        profile: 'gpu-whole',
        slice: 'whole',
        lease_id: null,
        enqueued: NOW - 30
      },
      {
        position: 1,
        owner: 'dave',
        kernel_id: 'k-d1',
        profile: 'gpu-10g',
        slice: '10GiB',
        lease_id: 'L9',
        label: 'work/dave-train.ipynb',
        enqueued: NOW - 90
      }
    ],
    decisions: [
      {
        at: NOW - 100,
        kind: 'warned',
        kernel_id: 'k-bob-1',
        owner: 'bob',
        name: 'b.ipynb',
        profile: 'gpu-10g',
        reason: 'idle',
        rule: 'students',
        action: 'shutdown',
        dry_run: false,
        message: 'Idle for 28 min'
      },
      {
        at: NOW - 50,
        kind: 'culled',
        kernel_id: 'k-bob-0',
        owner: 'bob',
        name: 'old/b0.ipynb',
        profile: 'gpu-10g',
        reason: 'idle',
        rule: 'students',
        action: 'shutdown',
        dry_run: true,
        message: 'Would shut down'
      },
      {
        at: NOW - 20,
        kind: 'hibernated',
        kernel_id: 'k-alice-1',
        owner: 'alice',
        name: 'x/a.ipynb',
        profile: 'gpu-20g-50',
        reason: 'gpu_idle',
        rule: 'default',
        action: 'hibernate',
        dry_run: false,
        message: 'Hibernated'
      }
    ],
    policy: { dry_run: false, rules: [] },
    ...overrides
  };
}

const PROFILE_SIZES: Record<string, [string, number | null]> = {
  'gpu-10g': ['GPU 10 GiB', 10],
  'gpu-20g': ['GPU 20 GiB', 20],
  'gpu-whole': ['whole GPU', null]
};

/** The three demo profiles; `startsNow` says which would start for the user now. */
export function profiles(startsNow: Record<string, boolean>): IProfile[] {
  return Object.entries(PROFILE_SIZES).map(([name, [display, gib]]) => ({
    name,
    display_name: display,
    launcher_name: `Python 3 · ${display}`,
    description: `${display} of a demo GPU`,
    slice_label: gib === null ? 'whole GPU' : `${gib} GiB`,
    memory: gib === null ? null : gib * GiB,
    sm_percent: null,
    whole: gib === null,
    isolation: gib === null ? 'exclusive' : 'soft',
    starts_now: !!startsNow[name]
  }));
}

/** Readings of two kernels on GPU-1 over three samples (alice's without a memory reading). */
export function telemetry(): ITelemetry {
  return {
    now: NOW,
    window: 600,
    gpus: [
      {
        uuid: 'GPU-1',
        label: 'GPU 0 · Demo · 40 GiB (declared)',
        memory: 40 * GiB,
        utilization: [[NOW - 10, 50]]
      },
      {
        uuid: 'GPU-2',
        label: 'GPU 1 · Demo · 40 GiB (declared)',
        memory: 40 * GiB,
        utilization: []
      }
    ],
    kernels: [
      {
        kernel_id: 'k-bob-1',
        owner: 'bob',
        name: 'b.ipynb',
        profile: 'gpu-10g',
        gpus: ['GPU-1'],
        slice_memory: 10 * GiB,
        samples: [
          [NOW - 10, 3 * GiB, 20],
          [NOW - 5, 4 * GiB, 30],
          [NOW, 5 * GiB, 40]
        ]
      },
      {
        kernel_id: 'k-alice-1',
        owner: 'alice',
        name: 'x/a.ipynb',
        profile: 'gpu-20g-50',
        gpus: ['GPU-1'],
        slice_memory: 10 * GiB,
        samples: [
          [NOW - 5, null, 10],
          [NOW, null, null]
        ]
      }
    ]
  };
}

/**
 * What the page shows of the pool's notifications, step by step, as toasts.ts places them: the
 * toasts on screen (at most three), the live ones sent to the notification centre, the records.
 */
export class Screen {
  constructor(readonly book = new NoticeBook(NOW - 1)) {}

  /** Kernels whose notebook has another kernel now; kernels on which a cell ran; toasts closed. */
  replaced = new Set<string>();
  ran = new Set<string>();
  closed = new Set<string>();
  ended = new Set<string>();

  /** The notifications now (`placeToasts` remembers what was on screen and what went to the centre). */
  look(): { toasts: IFact[]; centre: IFact[]; records: IFact[]; all: IFact[] } {
    const all = factsNow({
      me: this.book.me,
      happenings: this.book.happenings,
      replaced: this.replaced,
      ran: this.ran,
      closed: this.closed,
      ended: this.ended
    });
    // A fact that stopped holding is over, as toasts.ts remembers it.
    for (const f of all) {
      if (f.nature === 'record' && f.members.some(key => this._live.has(key))) {
        f.members.forEach(key => this.ended.add(key));
      }
    }
    this._live = new Set(all.filter(f => f.nature !== 'record').flatMap(f => f.members));
    const placed = placeToasts(all, this._placed, this._demoted);
    placed.demoted.forEach(key => this._demoted.add(key));
    this._placed = placed.onScreen;
    const live = all.filter(f => f.nature !== 'record');
    return {
      toasts: placed.onScreen.map(key => live.find(f => f.key === key)!),
      centre: live.filter(f => !placed.onScreen.includes(f.key)),
      records: all.filter(f => f.nature === 'record'),
      all
    };
  }

  /** The texts of the toasts on screen now. */
  toasts(): string[] {
    return this.look().toasts.map(f => f.message);
  }

  /** The user closes the toast with this key. */
  close(fact: IFact): void {
    fact.members.forEach(key => this.closed.add(key));
  }

  private _placed: string[] = [];
  private _demoted = new Set<string>();
  private _live = new Set<string>();
}
