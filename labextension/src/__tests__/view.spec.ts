import assert from 'node:assert/strict';

import {
  actionViews,
  budgetText,
  cardView,
  historyLine,
  HISTORY_KINDS,
  indicatorView,
  meanUtilization,
  quotaBars,
  stateView,
  statusView
} from '../view';
import { GiB, kernel, me, NOW } from './fixtures';

const warning = {
  action: 'shutdown' as const,
  reason: 'idle',
  message: 'Idle for 28 min: shuts down to give its GPU slice back.',
  deadline: NOW + 65,
  snoozes_left: 2,
  snooze_seconds: 1800
};

const DECLARED = [
  { uuid: 'GPU-D0', label: 'GPU 0 · Demo GPU · 40 GiB (declared)', source: 'declared' }
];

const budget = {
  scope: 'students',
  kind: 'member',
  period: 'week',
  gpu_hours: 10,
  used_hours: 6.24,
  rate: 0.25,
  resets_at: NOW + 86400
};

describe('statusView', () => {
  it('writes "used / limit" with a label, as jupyter-resource-usage does: "GPU mem: 10 / 40 GiB · 37%"', () => {
    const v = statusView(me(), null, NOW);
    assert.equal(v.text, 'GPU mem: 10 / 40 GiB · 37%');
    assert.equal(v.level, 'ok');
    assert.match(
      v.title,
      /You hold 10 GiB of GPU memory in 1 kernel; your quota is 40 GiB, 4 kernels\./
    );
    assert.match(v.title, /Click to open the GPU panel/);
  });

  it('leaves utilization out where no kernel has a reading (declared GPUs)', () => {
    const v = statusView(
      me({ kernels: [kernel({ utilization: { current: null, samples: [] } })] }),
      null,
      NOW
    );
    assert.equal(v.text, 'GPU mem: 10 / 40 GiB');
  });

  it('averages the utilization of the kernels that have readings', () => {
    const ks = [
      kernel({ kernel_id: 'a', utilization: { current: 80, samples: [] } }),
      kernel({ kernel_id: 'b', utilization: { current: 20, samples: [] } }),
      kernel({ kernel_id: 'c', utilization: { current: null, samples: [] } })
    ];
    assert.equal(meanUtilization(ks), 50);
    assert.equal(statusView(me({ kernels: ks }), null, NOW).text, 'GPU mem: 10 / 40 GiB · 50%');
  });

  it('says so when the limit reached is the kernel count', () => {
    const v = statusView(
      me({
        quota: { memory: 40 * GiB, sm_percent: null, kernels: 2 },
        usage: { memory: 20 * GiB, sm_percent: 0, kernels: 2 },
        kernels: []
      }),
      null,
      NOW
    );
    assert.equal(v.text, 'GPU kernels: 2 / 2');
    assert.equal(v.level, 'near');
    assert.match(v.title, /as many GPU kernels as your quota allows/);
  });

  it('without a memory quota never reads like a GPU’s size', () => {
    const v = statusView(
      me({ quota: { memory: null, sm_percent: null, kernels: null } }),
      null,
      NOW
    );
    assert.equal(v.text, 'GPU mem: 10 GiB held · 37%');
    assert.match(v.title, /you have no quota/);
  });

  it('says the GPU-hour budget in words, as the panel does, and turns "near" at 80% of it', () => {
    const v = statusView(me({ budget }), null, NOW);
    assert.equal(v.text, 'GPU mem: 10 / 40 GiB · 37% · GPU time this week: 6.2 of 10 h');
    // A narrow window: the budget, and the quota only where it is near its limit.
    assert.equal(v.short, 'GPU time this week: 6.2 of 10 h');
    assert.equal(
      statusView(me({ budget, usage: { memory: 36 * GiB, sm_percent: 0, kernels: 1 } }), null, NOW)
        .short,
      'GPU mem: 36 / 40 GiB · GPU time this week: 6.2 of 10 h'
    );
    assert.equal(statusView(me(), null, NOW).short, 'GPU mem: 10 / 40 GiB · 37%'); // no budget: all of it
    assert.match(v.title, /GPU time this week: 6\.2 of 10 h \(resets /);
    assert.equal(v.level, 'ok');
    assert.equal(
      statusView(me({ budget: { ...budget, used_hours: 8.5 } }), null, NOW).level,
      'near'
    );
    assert.equal(budgetText(budget), 'GPU time this week: 6.2 of 10 h');
    assert.equal(budgetText({ ...budget, period: 'day' }), 'GPU time today: 6.2 of 10 h');
    assert.equal(budgetText({ ...budget, period: 'month' }), 'GPU time this month: 6.2 of 10 h');
  });

  it('turns "near" at 80% of the memory quota or at the kernel limit', () => {
    assert.equal(
      statusView(me({ usage: { memory: 32 * GiB, sm_percent: 0, kernels: 1 } }), null, NOW).level,
      'near'
    );
    assert.equal(
      statusView(me({ usage: { memory: 31 * GiB, sm_percent: 0, kernels: 1 } }), null, NOW).level,
      'ok'
    );
    assert.equal(
      statusView(me({ usage: { memory: 10 * GiB, sm_percent: 0, kernels: 4 } }), null, NOW).level,
      'near'
    );
  });

  it('turns "warning" while a cull or hibernation is pending, and says when', () => {
    const v = statusView(me({ kernels: [kernel({ warning })] }), null, NOW);
    assert.equal(v.level, 'warning');
    // Under two minutes away: the time with its seconds ("at 21:10" read as past at 21:10:55).
    assert.match(v.title, /Untitled\.ipynb: shuts down in 1:05 \(at \d\d:\d\d:\d\d\)\./);
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
    const missing = statusView(
      null,
      'the jupyter-gpu-pool server extension is not enabled on this server',
      NOW
    );
    assert.equal(missing.text, 'no GPU pool');
    assert.equal(missing.level, 'off');
  });

  it('says what a starting kernel’s pod does (Kubernetes), short, the whole of it in the tooltip', () => {
    const progress = 'Pulling image quay.io/jupyter/pytorch-notebook:cuda12-2024-11-18: 40 s';
    const starting = kernel({ name: 'train.ipynb', execution_state: 'starting', progress });
    const v = statusView(me({ kernels: [starting] }), null, NOW);
    assert.equal(
      v.text,
      'GPU mem: 10 / 40 GiB · 37% · starting: Pulling image quay.io/jupyter/pytorch-n…'
    );
    assert.match(
      v.title,
      /^train\.ipynb is starting: Pulling image quay\.io\/jupyter\/pytorch-notebook:cuda12-2024-11-18: 40 s\.$/m
    );
    const two = statusView(
      me({ kernels: [starting, kernel({ kernel_id: 'k2', progress: 'Scheduling the pod: 3 s' })] }),
      null,
      NOW
    );
    assert.match(two.text, / · 2 kernels starting$/);
    // Once started (progress null), nothing of it is left.
    const started = statusView(me({ kernels: [kernel({ progress: null })] }), null, NOW);
    assert.doesNotMatch(started.text + started.title, /starting/);
  });

  it('says it is loading before the first answer', () => {
    assert.equal(statusView(null, null, NOW).level, 'loading');
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
      'queued at position 3: waits for a free slice to resume'
    );
    assert.equal(
      stateView(kernel({ state: 'queued', lease_id: null, queue_position: 2 }), NOW).label,
      'queued at position 2: starts when a slice frees up'
    );
    assert.match(stateView(kernel({ state: 'resuming' }), NOW).label, /^resuming/);
    assert.match(
      stateView(kernel({ state: 'hibernating' }), NOW).label,
      /^hibernating: moving GPU memory/
    );
  });

  it('shows a shutdown under way (the pool acting at a deadline) as such, nothing to keep alive', () => {
    const v = stateView(kernel({ state: 'stopping', warning: null, actions: [] }), NOW);
    assert.deepEqual(v, {
      kind: 'stopping',
      label: 'shutting down: giving the GPU slice back…',
      detail: ''
    });
  });

  it('shows a starting kernel’s progress as its state, while there is any', () => {
    const v = stateView(
      kernel({
        execution_state: 'starting',
        progress: 'Pulling image jupyter/scipy-notebook: 12 s'
      }),
      NOW
    );
    assert.deepEqual(v, {
      kind: 'starting',
      label: 'starting: Pulling image jupyter/scipy-notebook: 12 s',
      detail: ''
    });
    assert.equal(
      cardView(kernel({ progress: 'Scheduling the pod: 3 s' }), NOW).state.label,
      'starting: Scheduling the pod: 3 s'
    );
    assert.equal(
      stateView(kernel({ execution_state: 'starting', progress: null }), NOW).label,
      'starting'
    );
  });

  it('says when the policy will act on an idle kernel', () => {
    const v = stateView(
      kernel({
        idle_since: NOW - 60,
        next_action: { action: 'hibernate', reason: 'idle', at: NOW + 600 }
      }),
      NOW
    );
    assert.match(v.detail, /^will be hibernated at \d\d:\d\d if still idle$/);
    const shut = stateView(
      kernel({ next_action: { action: 'shutdown', reason: 'max_age', at: NOW + 600 } }),
      NOW
    );
    assert.match(
      shut.detail,
      /^will be shut down at \d\d:\d\d \(maximum kernel age reached\): its variables will be lost$/
    );
  });

  it('says until when a Keep alive holds, but not beside a pending warning', () => {
    const kept = stateView(kernel({ idle_since: NOW - 60, snoozed_until: NOW + 1800 }), NOW);
    assert.match(kept.label, /^idle since \d\d:\d\d \(1 min\)$/);
    assert.match(kept.detail, /^kept alive until \d\d:\d\d$/);
    assert.equal(stateView(kernel({ snoozed_until: NOW - 1 }), NOW).detail, '');
    const warned = stateView(
      kernel({
        snoozed_until: NOW + 1800,
        warning,
        next_action: { action: 'shutdown', reason: 'idle', at: NOW + 65 }
      }),
      NOW
    );
    assert.equal(warned.detail, ''); // the countdown says it all: no "kept alive until" beside "shuts down in"
  });

  it('marks every move on a declared GPU: nothing to move', () => {
    for (const state of ['hibernating', 'hibernated', 'resuming'] as const) {
      assert.match(
        stateView(kernel({ state, gpus: DECLARED }), NOW).label,
        /declared: no GPU memory to move/
      );
    }
    assert.match(stateView(kernel({ state: 'hibernated' }), NOW).detail, /Run a cell/);
  });

  it('shows a hibernated kernel as resuming while a cell of this browser waits on it', () => {
    const v = stateView(kernel({ state: 'hibernated', gpus: DECLARED }), NOW, true);
    assert.equal(v.kind, 'resuming');
    assert.equal(v.label, 'resuming: taking a GPU slice again (declared: no GPU memory to move)…');
    assert.match(v.detail, /Your cell runs as soon as it holds the slice/);
    // queued stays queued, with its place
    assert.match(
      stateView(kernel({ state: 'queued', queue_position: 1 }), NOW, true).label,
      /^queued at position 1/
    );
  });

  it('says a kernel started without a slice has no GPU yet, not that it hibernated', () => {
    const v = stateView(kernel({ state: 'no_gpu_yet', gpus: [] }), NOW);
    assert.equal(v.label, 'no GPU yet: takes one when a cell runs');
    assert.doesNotMatch(v.label + v.detail, /hibernat|resum/);
    const taking = stateView(kernel({ state: 'no_gpu_yet', gpus: [] }), NOW, true);
    assert.equal(taking.label, 'taking a GPU slice for the first cell…');
    const k = kernel({ state: 'no_gpu_yet', gpus: [] });
    const bar = indicatorView(me({ kernels: [k] }), k.kernel_id);
    assert.equal(bar.text, 'no GPU yet');
    assert.match(bar.title, /State: no GPU yet: takes one when a cell runs\./);
  });
});

describe('actionViews', () => {
  it('offers the server’s actions in a fixed order with their labels', () => {
    const labels = actionViews(kernel({ warning, actions: ['shutdown', 'release', 'snooze'] })).map(
      a => a.label
    );
    assert.deepEqual(labels, ['Keep alive', 'Release GPU', 'Shut down']);
  });

  it('offers Keep alive only while an action is pending and a snooze is left', () => {
    assert.deepEqual(
      actionViews(kernel()).map(a => a.action),
      ['release', 'shutdown']
    );
    assert.deepEqual(
      actionViews(kernel({ warning: { ...warning, snoozes_left: 0 } })).map(a => a.action),
      ['release', 'shutdown']
    );
  });

  it('offers Resume for a hibernated kernel', () => {
    const views = actionViews(kernel({ state: 'hibernated', actions: ['resume', 'shutdown'] }));
    assert.deepEqual(
      views.map(a => a.label),
      ['Resume', 'Shut down']
    );
    assert.equal(views[0].confirm, null);
    const declared = actionViews(
      kernel({ state: 'hibernated', gpus: DECLARED, actions: ['resume'] })
    );
    assert.match(declared[0].title, /declared GPU: no GPU memory to restore/);
  });

  it('asks before an action that loses the variables, and mentions a running computation', () => {
    const hib = actionViews(kernel({ release_action: 'hibernate' })).find(
      a => a.action === 'release'
    )!;
    assert.equal(hib.confirm, null);
    assert.match(hib.title, /keep the variables/);
    const shut = actionViews(
      kernel({
        release_action: 'shutdown',
        hibernate_unavailable: 'no cuda-checkpoint on this machine'
      })
    ).find(a => a.action === 'release')!;
    assert.match(shut.confirm!.body, /variables will be lost/);
    assert.doesNotMatch(shut.confirm!.body, /running a computation/);
    assert.match(shut.title, /it cannot hibernate \(no cuda-checkpoint on this machine\)\.$/);
    // An MPS kernel: in words, not the driver's error number.
    const mps = actionViews(
      kernel({
        isolation: 'mps',
        release_action: 'shutdown',
        hibernate_unavailable: 'an MPS client cannot be checkpointed (CUDA error 801)'
      })
    ).find(a => a.action === 'release')!;
    assert.equal(
      mps.title,
      'Shut the kernel down now to give its GPU slice back (its variables are lost): a kernel on an NVIDIA MPS slice cannot hibernate.'
    );
    assert.doesNotMatch(mps.title, /801|CUDA error/);
    const busy = actionViews(kernel({ release_action: 'shutdown', execution_state: 'busy' }));
    assert.match(
      busy.find(a => a.action === 'release')!.confirm!.body,
      /running a computation now: that computation stops too/
    );
    assert.match(
      busy.find(a => a.action === 'shutdown')!.confirm!.body,
      /running a computation now/
    );
    const busyHib = actionViews(kernel({ release_action: 'hibernate', execution_state: 'busy' }));
    assert.match(busyHib.find(a => a.action === 'release')!.confirm!.body, /cannot hibernate/);
    assert.match(
      actionViews(kernel()).find(a => a.action === 'shutdown')!.confirm!.body,
      /Untitled\.ipynb/
    );
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
    assert.equal(v.declared, false);
  });

  it('counts down to a time, says what is lost and what the user can still do', () => {
    const v = cardView(kernel({ warning: { ...warning, action: 'hibernate' } }), NOW + 5);
    assert.match(v.countdown!.text, /^hibernates in 1:00 \(at \d\d:\d\d:\d\d\)$/);
    assert.equal(
      v.countdown!.message,
      'Idle too long: its GPU slice goes back to the pool, its variables are kept. Run a cell or Keep alive to keep the slice.'
    );
    assert.equal(v.countdown!.detail, warning.message);
    assert.equal(
      cardView(kernel({ warning: { ...warning, reason: 'gpu_idle' } }), NOW).countdown!.message,
      'GPU memory held, GPU unused: its variables will be lost. Run a cell or Keep alive to keep it.'
    );
    assert.equal(
      cardView(kernel({ warning: { ...warning, snoozes_left: 0 } }), NOW).countdown!.message,
      'Idle too long: its variables will be lost. Run a cell to keep it, or save your work.'
    );
    assert.equal(cardView(kernel({ warning }), NOW + 70).countdown!.text, 'shutting down now');
  });

  it('says "no reading" where the GPU has none, and "declared" where it is declared', () => {
    const v = cardView(
      kernel({ memory_used: null, utilization: { current: null, samples: [] } }),
      NOW
    );
    assert.equal(v.memory.text, '10 GiB slice');
    assert.equal(v.memory.note, 'no reading');
    assert.equal(v.memory.fraction, null); // no meter without a reading
    assert.equal(v.utilization.text, 'no reading');
    assert.equal(v.utilization.points, '');
    assert.equal(v.utilization.label, 'GPU utilization: no reading');
    const d = cardView(kernel({ gpus: DECLARED, memory_used: null, utilization: null }), NOW);
    assert.equal(d.declared, true);
    assert.equal(d.memory.note, 'no reading (declared GPU)');
  });

  it('shows a hibernated kernel as holding no GPU', () => {
    const v = cardView(
      kernel({ state: 'hibernated', gpus: [], memory_used: null, actions: ['resume', 'shutdown'] }),
      NOW
    );
    assert.equal(v.gpu, 'no GPU held');
    assert.equal(v.memory.text, '0 of 10 GiB');
    assert.equal(v.memory.fraction, 0);
    assert.deepEqual(
      v.actions.map(a => a.action),
      ['resume', 'shutdown']
    );
  });

  it('shows a queued kernel as waiting', () => {
    const v = cardView(kernel({ state: 'queued', gpus: [], queue_position: 2 }), NOW);
    assert.equal(v.gpu, 'waiting for a GPU');
    assert.equal(v.state.kind, 'queued');
  });

  it('copes with the short object the server sends for a start waiting in the queue', () => {
    const waiting = {
      kernel_id: 'k-q',
      lease_id: null,
      name: 'wait.ipynb',
      profile: 'gpu-whole',
      profile_display_name: 'Whole GPU',
      state: 'queued',
      queue_position: 1,
      warning: null,
      actions: []
    } as unknown as Parameters<typeof cardView>[0];
    const v = cardView(waiting, NOW);
    assert.equal(v.gpu, 'waiting for a GPU');
    assert.equal(v.state.label, 'queued at position 1: starts when a slice frees up');
    assert.equal(v.memory.text, 'none held');
    assert.deepEqual(v.actions, []);
    assert.equal(indicatorView(me({ kernels: [waiting] }), 'k-q').text, 'queued #1');
  });

  it('names a kernel without a notebook by its id', () => {
    assert.equal(cardView(kernel({ name: '' }), NOW).title, 'kernel 0b6f5f0e');
  });
});

describe('quotaBars', () => {
  it('one bar per resource, "near" from 80%, the kernel limit marked when reached', () => {
    const bars = quotaBars(me({ usage: { memory: 36 * GiB, sm_percent: 0, kernels: 4 } }));
    assert.deepEqual(
      bars.map(b => [b.label, b.text, b.level, b.note]),
      [
        ['GPU memory', '36 GiB of 40 GiB', 'near', ''],
        ['GPU kernels', '4 of 4', 'near', 'limit reached']
      ]
    );
    assert.equal(bars[0].fraction, 0.9);
  });
  it('has no fraction (so no meter) where unlimited; adds SM share and GPU time where limited', () => {
    const bars = quotaBars(
      me({
        quota: { memory: null, sm_percent: 100, kernels: null },
        usage: { memory: GiB, sm_percent: 50, kernels: 1 },
        budget
      })
    );
    assert.equal(bars[0].text, '1 GiB (no limit)');
    assert.equal(bars[0].fraction, null);
    assert.deepEqual(
      [bars[2].label, bars[2].text, bars[2].fraction],
      ['SM share', '50% of 100%', 0.5]
    );
    assert.deepEqual([bars[3].label, bars[3].text], ['GPU time this week', '6.2 of 10 h']);
    assert.ok(Math.abs(bars[3].fraction! - 0.624) < 1e-9);
  });
});

describe('indicatorView', () => {
  it('says where the notebook’s kernel runs (the kernel name says the profile)', () => {
    const v = indicatorView(me(), kernel().kernel_id);
    assert.equal(v.visible, true);
    assert.equal(v.text, 'GPU 0');
    assert.match(
      v.title,
      /This kernel holds a 10 GiB slice \(soft isolation\) of GPU 0 · NVIDIA H100/
    );
  });
  it('marks declared GPUs and whole GPUs', () => {
    const declared = me({ kernels: [kernel({ gpus: DECLARED })] });
    const v = indicatorView(declared, kernel().kernel_id);
    assert.equal(v.text, 'GPU 0 (declared)');
    assert.match(v.title, /the kernel holds no GPU memory, so hibernating it moves nothing/);
    const whole = me({
      kernels: [
        kernel({
          slice: { label: 'whole GPU', memory: null, sm_percent: null, whole: true, gpu_count: 1 }
        })
      ]
    });
    assert.equal(indicatorView(whole, kernel().kernel_id).text, 'GPU 0 (whole)');
  });
  it('shows the state where the kernel holds no GPU', () => {
    const m = me({ kernels: [kernel({ state: 'hibernated', gpus: [] })] });
    assert.equal(indicatorView(m, kernel().kernel_id).text, 'hibernated');
    const q = me({ kernels: [kernel({ state: 'queued', gpus: [], queue_position: 4 })] });
    assert.equal(indicatorView(q, kernel().kernel_id).text, 'queued #4');
  });
  it('hides for a kernel that is not the pool’s, or without a pool', () => {
    assert.equal(indicatorView(me(), 'other').visible, false);
    assert.equal(indicatorView(null, kernel().kernel_id).visible, false);
    assert.equal(
      indicatorView(me({ pool: { enabled: false, note: '' } }), kernel().kernel_id).visible,
      false
    );
  });
});

describe('historyLine', () => {
  const base = { at: NOW, kernel_id: 'k', message: 'server text' };
  it('writes one plain sentence, the rule last', () => {
    assert.equal(
      historyLine({ ...base, kind: 'culled', reason: 'idle', rule: 'demo' }),
      'Shut down because it was idle too long; its variables are gone. Rule: demo.'
    );
    assert.equal(
      historyLine({
        ...base,
        kind: 'culled',
        reason: 'idle',
        rule: 'demo',
        note: 'hibernation unavailable (no hibernator is installed), so shut down instead'
      }),
      'Shut down because it was idle too long, and it could not hibernate; its variables are gone. Rule: demo.'
    );
    assert.equal(
      historyLine({ ...base, kind: 'hibernated', reason: 'idle', rule: 'demo', declared: true }),
      'Hibernated because it was idle too long; its variables are kept (declared: no GPU memory to move). Rule: demo.'
    );
    assert.equal(
      historyLine({ ...base, kind: 'resumed', rule: 'hibernation' }),
      'Resumed: it holds a GPU slice again.'
    );
    assert.equal(
      historyLine({ ...base, kind: 'refused', reason: 'quota_exceeded' }),
      'Could not start: your GPU quota is used up.'
    );
    assert.equal(
      historyLine({ ...base, kind: 'released', reason: 'admin' }),
      'Shut down by an admin; its variables are gone.'
    );
  });

  it('names a rule the admin gave no name by whom it covers, not "rule 0"', () => {
    const entry = { ...base, kind: 'culled', reason: 'idle', rule: 'rule 0' };
    assert.equal(
      historyLine({ ...entry, rule_label: 'for everyone' }),
      'Shut down because it was idle too long; its variables are gone. Rule: for everyone.'
    );
    assert.doesNotMatch(historyLine({ ...entry, rule_label: 'for everyone' }), /rule 0/);
  });

  it('shows a failed hibernation in the server’s words, which say the kernel kept running', () => {
    const message =
      'Hibernation failed: the checkpoint of this kernel failed (CUDA_ERROR_NOT_PERMITTED); the kernel kept running, with its variables and its GPU slice.';
    const entry = { ...base, kind: 'hibernation_failed', reason: 'checkpoint_failed', message };
    assert.ok(HISTORY_KINDS.has('hibernation_failed'));
    assert.equal(historyLine({ ...entry, rule: 'demo' }), `${message} Rule: demo.`);
  });

  it('says that a kernel ended with its server, hibernated or not, and what to do', () => {
    const ended =
      'Ended when the server stopped; its variables are gone. Open the notebook and start a kernel to go on.';
    assert.equal(
      historyLine({
        ...base,
        kind: 'released',
        reason: 'server_stopped',
        action: 'shutdown',
        with_server: true
      }),
      ended
    );
    assert.equal(
      historyLine({
        ...base,
        kind: 'reclaimed',
        reason: 'kernel process and its server are gone',
        with_server: true
      }),
      ended
    );
    assert.equal(
      historyLine({ ...base, kind: 'reclaimed', reason: 'kernel never started' }),
      'Its kernel process ended, so its GPU slice went back to the pool.'
    );
  });
});
