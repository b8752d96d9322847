/** Payloads shaped like docs/api.md's examples, for the unit tests. */

import type { IKernel, IMe, IPool } from '../types';

export const GiB = 1024 ** 3;
export const NOW = 1732270000;

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
    utilization: { current: 37, samples: [[NOW - 10, 35], [NOW - 5, 37]] },
    queue_position: null,
    warning: null,
    can_hibernate: true,
    hibernate_unavailable: null,
    release_action: 'hibernate',
    actions: ['snooze', 'release', 'shutdown'],
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
        id: 'L1', owner: 'bob', kernel_id: 'k-bob-1', profile: 'gpu-10g', state: 'active',
        gpus: ['GPU-1'], memory: 10 * GiB, sm_percent: null, created: NOW - 600, label: 'b.ipynb'
      },
      {
        id: 'L2', owner: 'alice', kernel_id: 'k-alice-1', profile: 'gpu-20g-50', state: 'active',
        gpus: ['GPU-1'], memory: 10 * GiB, sm_percent: 50, created: NOW - 60, label: 'x/a.ipynb'
      },
      {
        id: 'L3', owner: 'bob', kernel_id: 'k-bob-2', profile: 'gpu-10g', state: 'hibernated',
        gpus: [], memory: 10 * GiB, sm_percent: null, created: NOW - 7200, label: ''
      }
    ],
    queue: [
      { position: 2, owner: 'carol', kernel_id: 'k-c2', profile: 'gpu-whole', slice: 'whole', lease_id: null, enqueued: NOW - 30 },
      { position: 1, owner: 'dave', kernel_id: 'k-d1', profile: 'gpu-10g', slice: '10GiB', lease_id: 'L9', enqueued: NOW - 90 }
    ],
    decisions: [
      { at: NOW - 100, kind: 'warned', kernel_id: 'k-bob-1', owner: 'bob', reason: 'idle', dry_run: false, message: 'Idle for 28 min' },
      { at: NOW - 50, kind: 'culled', kernel_id: 'k-bob-0', owner: 'bob', reason: 'idle', dry_run: true, message: 'Would shut down' }
    ],
    policy: { dry_run: false, rules: [] },
    ...overrides
  };
}
