import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import {
  actionViews,
  cardView,
  indicatorView,
  meanUtilization,
  poolView,
  quotaBars,
  stateView,
  statusView
} from '../view';
import { GiB, kernel, me, NOW, pool } from './fixtures';

const warning = {
  action: 'shutdown' as const,
  reason: 'idle',
  message: 'Idle for 28 min: shuts down to give its GPU slice back.',
  deadline: NOW + 65,
  snoozes_left: 2,
  snooze_seconds: 1800
};

describe('statusView', () => {
  it('shows use against quota and utilization: "GPU 10/40 GiB · 37%"', () => {
    const v = statusView(me(), null, NOW);
    assert.equal(v.text, 'GPU 10/40 GiB · 37%');
    assert.equal(v.level, 'ok');
    assert.match(v.title, /You hold 10 GiB of GPU memory in 1 kernel; your quota is 40 GiB, 4 kernels\./);
    assert.match(v.title, /Click to open the GPU panel/);
  });

  it('leaves utilization out where no kernel has a reading (declared GPUs)', () => {
    const v = statusView(me({ kernels: [kernel({ utilization: { current: null, samples: [] } })] }), null, NOW);
    assert.equal(v.text, 'GPU 10/40 GiB');
  });

  it('averages the utilization of the kernels that have readings', () => {
    const ks = [
      kernel({ kernel_id: 'a', utilization: { current: 80, samples: [] } }),
      kernel({ kernel_id: 'b', utilization: { current: 20, samples: [] } }),
      kernel({ kernel_id: 'c', utilization: { current: null, samples: [] } })
    ];
    assert.equal(meanUtilization(ks), 50);
    assert.equal(statusView(me({ kernels: ks }), null, NOW).text, 'GPU 10/40 GiB · 50%');
  });

  it('turns "near" at 80% of the memory quota or at the kernel limit', () => {
    assert.equal(statusView(me({ usage: { memory: 32 * GiB, sm_percent: 0, kernels: 1 } }), null, NOW).level, 'near');
    assert.equal(statusView(me({ usage: { memory: 31 * GiB, sm_percent: 0, kernels: 1 } }), null, NOW).level, 'ok');
    assert.equal(statusView(me({ usage: { memory: 10 * GiB, sm_percent: 0, kernels: 4 } }), null, NOW).level, 'near');
  });

  it('turns "warning" while a cull or hibernation is pending, and says when', () => {
    const v = statusView(me({ kernels: [kernel({ warning })] }), null, NOW);
    assert.equal(v.level, 'warning');
    assert.match(v.title, /Untitled\.ipynb: shuts down in 1:05\./);
  });

  it('reads "no GPU pool" where the server has none, with the server’s reason', () => {
    const off = statusView(
      me({ pool: { enabled: false, note: 'GPUPool misconfigured: bad profile' }, kernels: [] }),
      null,
      NOW
    );
    assert.equal(off.text, 'no GPU pool');
    assert.equal(off.level, 'off');
    assert.match(off.title, /misconfigured: bad profile/);
    const missing = statusView(null, 'the jupyter-gpu-pool server extension is not enabled on this server', NOW);
    assert.equal(missing.text, 'no GPU pool');
    assert.equal(missing.level, 'off');
  });

  it('says it is loading before the first answer', () => {
    assert.equal(statusView(null, null, NOW).level, 'loading');
  });

  it('writes only the use where the user has no memory quota', () => {
    const v = statusView(me({ quota: { memory: null, sm_percent: null, kernels: null } }), null, NOW);
    assert.equal(v.text, 'GPU 10 GiB · 37%');
    assert.match(v.title, /no quota/);
  });
});

describe('stateView', () => {
  it('tells running, idle since, hibernated, queued at position N', () => {
    assert.equal(stateView(kernel({ execution_state: 'busy' }), NOW).label, 'running');
    const idle = stateView(kernel({ idle_since: NOW - 180 }), NOW);
    assert.equal(idle.kind, 'idle');
    assert.match(idle.label, /^idle since \d\d:\d\d \(3 min\)$/);
    assert.equal(stateView(kernel({ state: 'hibernated', gpus: [] }), NOW).kind, 'hibernated');
    assert.match(stateView(kernel({ state: 'hibernated' }), NOW).label, /variables kept/);
    assert.equal(
      stateView(kernel({ state: 'queued', queue_position: 3 }), NOW).label,
      'queued at position 3: waiting for a free slice'
    );
    assert.match(stateView(kernel({ state: 'resuming' }), NOW).label, /^resuming/);
    assert.match(stateView(kernel({ state: 'hibernating' }), NOW).label, /^hibernating/);
  });

  it('says until when a Keep alive holds', () => {
    const kept = stateView(kernel({ idle_since: NOW - 60, snoozed_until: NOW + 1800 }), NOW).label;
    assert.match(kept, /^idle since \d\d:\d\d \(1 min\) · kept alive until \d\d:\d\d$/);
    assert.doesNotMatch(stateView(kernel({ snoozed_until: NOW - 1 }), NOW).label, /kept alive/);
  });
});

describe('actionViews', () => {
  it('offers the server’s actions in a fixed order with their labels', () => {
    const labels = actionViews(kernel({ actions: ['shutdown', 'release', 'snooze'] })).map(a => a.label);
    assert.deepEqual(labels, ['Keep alive', 'Release GPU now', 'Shut down']);
  });

  it('offers Resume for a hibernated kernel', () => {
    const views = actionViews(kernel({ state: 'hibernated', actions: ['resume', 'shutdown'] }));
    assert.deepEqual(views.map(a => a.label), ['Resume', 'Shut down']);
    assert.equal(views[0].confirm, null);
  });

  it('asks before an action that loses the variables, not before one that keeps them', () => {
    const hib = actionViews(kernel({ release_action: 'hibernate' })).find(a => a.action === 'release')!;
    assert.equal(hib.confirm, null);
    assert.match(hib.title, /keep the variables/);
    const shut = actionViews(
      kernel({ release_action: 'shutdown', hibernate_unavailable: 'MPS clients cannot be checkpointed' })
    ).find(a => a.action === 'release')!;
    assert.match(shut.confirm!, /variables will be lost/);
    assert.match(shut.title, /cannot hibernate: MPS clients/);
    assert.match(actionViews(kernel()).find(a => a.action === 'shutdown')!.confirm!, /Untitled\.ipynb/);
  });

  it('says how long Keep alive postpones and how many snoozes are left', () => {
    const keep = actionViews(kernel({ warning })).find(a => a.action === 'snooze')!;
    assert.equal(keep.title, 'Postpone the shutdown by 30 min (2 snoozes left)');
  });
});

describe('cardView', () => {
  it('shows notebook, profile, GPU, memory of the slice, utilization and no countdown', () => {
    const v = cardView(kernel(), NOW);
    assert.equal(v.title, 'Untitled.ipynb');
    assert.equal(v.path, 'analysis/Untitled.ipynb');
    assert.equal(v.profile, 'GPU 10 GiB');
    assert.equal(v.gpu, 'GPU 0 · NVIDIA H100 · 80 GiB (detected)');
    assert.equal(v.memory.text, '3 GiB of 10 GiB');
    assert.equal(v.memory.note, '');
    assert.equal(v.memory.fraction, 0.3);
    assert.equal(v.utilization.text, '37%');
    assert.equal(v.utilization.points.split(' ').length, 2);
    assert.match(v.utilization.label, /37% now; last 5 min: min 35%, max 37%/);
    assert.equal(v.countdown, null);
  });

  it('shows a countdown while an action is pending', () => {
    const v = cardView(kernel({ warning: { ...warning, action: 'hibernate' } }), NOW + 5);
    assert.deepEqual(v.countdown, {
      text: 'hibernates in 1:00',
      message: 'Idle too long: its GPU slice goes back to the pool, its variables are kept.',
      detail: warning.message,
      level: 'warning'
    });
    assert.equal(
      cardView(kernel({ warning: { ...warning, reason: 'gpu_idle' } }), NOW).countdown!.message,
      'GPU memory held, GPU unused: its GPU slice goes back to the pool, its variables are lost.'
    );
    assert.equal(cardView(kernel({ warning }), NOW + 70).countdown!.text, 'shutting down now');
  });

  it('says "no reading" where the GPU is declared (no NVML)', () => {
    const v = cardView(kernel({ memory_used: null, utilization: { current: null, samples: [] } }), NOW);
    assert.equal(v.memory.text, '10 GiB slice');
    assert.equal(v.memory.note, 'no reading');
    assert.equal(v.memory.fraction, null);
    assert.equal(v.utilization.text, 'no reading');
    assert.equal(v.utilization.points, '');
    assert.equal(v.utilization.label, 'GPU utilization: no reading');
  });

  it('shows a hibernated kernel as holding no GPU', () => {
    const v = cardView(kernel({ state: 'hibernated', gpus: [], memory_used: null, actions: ['resume', 'shutdown'] }), NOW);
    assert.equal(v.gpu, 'no GPU held');
    assert.equal(v.memory.text, '0 of 10 GiB');
    assert.equal(v.memory.fraction, 0);
    assert.deepEqual(v.actions.map(a => a.action), ['resume', 'shutdown']);
  });

  it('shows a queued kernel as waiting', () => {
    const v = cardView(kernel({ state: 'queued', gpus: [], queue_position: 2 }), NOW);
    assert.equal(v.gpu, 'waiting for a GPU');
    assert.equal(v.state.kind, 'queued');
  });

  it('copes with the short object the server sends for a start waiting in the queue', () => {
    const waiting = {
      kernel_id: 'k-q', lease_id: null, name: 'wait.ipynb', profile: 'gpu-whole',
      profile_display_name: 'Whole GPU', state: 'queued', queue_position: 1, warning: null, actions: []
    } as unknown as Parameters<typeof cardView>[0];
    const v = cardView(waiting, NOW);
    assert.equal(v.gpu, 'waiting for a GPU');
    assert.equal(v.state.label, 'queued at position 1: waiting for a free slice');
    assert.equal(v.memory.text, 'none held');
    assert.deepEqual(v.actions, []);
    assert.equal(indicatorView(me({ kernels: [waiting] }), 'k-q').text, 'Whole GPU · queued #1');
  });

  it('names a kernel without a notebook by its id', () => {
    assert.equal(cardView(kernel({ name: '' }), NOW).title, 'kernel 0b6f5f0e');
  });
});

describe('quotaBars', () => {
  it('one bar per limited resource, "near" from 80%', () => {
    const bars = quotaBars(me({ usage: { memory: 36 * GiB, sm_percent: 0, kernels: 1 } }));
    assert.deepEqual(
      bars.map(b => [b.label, b.text, b.level]),
      [
        ['GPU memory', '36 GiB of 40 GiB', 'near'],
        ['GPU kernels', '1 of 4', 'ok']
      ]
    );
    assert.equal(bars[0].fraction, 0.9);
  });
  it('says "no quota" and has no fraction where unlimited; adds SM share where limited', () => {
    const bars = quotaBars(me({ quota: { memory: null, sm_percent: 100, kernels: null }, usage: { memory: GiB, sm_percent: 50, kernels: 1 } }));
    assert.equal(bars[0].text, '1 GiB (no quota)');
    assert.equal(bars[0].fraction, null);
    assert.deepEqual([bars[2].label, bars[2].text, bars[2].fraction], ['SM share', '50% of 100%', 0.5]);
  });
});

describe('indicatorView', () => {
  it('shows the slice and GPU of the notebook’s kernel', () => {
    const v = indicatorView(me(), kernel().kernel_id);
    assert.equal(v.visible, true);
    assert.equal(v.text, 'GPU 10 GiB · GPU 0');
    assert.match(v.title, /profile GPU 10 GiB \(10 GiB, soft isolation\) on GPU 0 · NVIDIA H100/);
  });
  it('shows the state where the kernel holds no GPU', () => {
    const m = me({ kernels: [kernel({ state: 'hibernated', gpus: [] })] });
    assert.equal(indicatorView(m, kernel().kernel_id).text, 'GPU 10 GiB · hibernated');
    const q = me({ kernels: [kernel({ state: 'queued', gpus: [], queue_position: 4 })] });
    assert.equal(indicatorView(q, kernel().kernel_id).text, 'GPU 10 GiB · queued #4');
  });
  it('hides for a kernel that is not the pool’s, or without a pool', () => {
    assert.equal(indicatorView(me(), 'other').visible, false);
    assert.equal(indicatorView(null, kernel().kernel_id).visible, false);
    assert.equal(indicatorView(me({ pool: { enabled: false, note: '' } }), kernel().kernel_id).visible, false);
  });
});

describe('poolView', () => {
  it('groups leases by user, orders the queue, newest decisions first', () => {
    const v = poolView(pool(), NOW);
    assert.deepEqual(v.owners.map(o => [o.owner, o.memoryText, o.leases.length]), [
      ['alice', '10 GiB', 1],
      ['bob', '20 GiB', 2]
    ]);
    assert.equal(v.owners[0].leases[0].text, 'a.ipynb · gpu-20g-50 · 10 GiB · 50% SM · GPU 0 · for 1 min');
    assert.match(v.owners[1].leases[1].text, /^kernel k-bob-2 · gpu-10g · 10 GiB · no GPU · for 2 h$/);
    assert.deepEqual(v.queue.map(q => q.position), [1, 2]);
    assert.match(v.queue[0].text, /^dave · gpu-10g \(10GiB\) · resume · waiting 1 min$/);
    assert.deepEqual(v.decisions.map(d => [d.dryRun, d.text]), [
      [true, 'culled · bob · idle: Would shut down'],
      [false, 'warned · bob · idle: Idle for 28 min']
    ]);
    assert.equal(v.gpus[0].memoryText, '20 GiB of 40 GiB in 2 slices');
    assert.equal(v.gpus[0].fraction, 0.5);
    assert.equal(v.gpus[0].utilization, '–');
  });
});
