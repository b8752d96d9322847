import assert from 'node:assert/strict';

import {
  dashboardView,
  decisionRow,
  filterDecisions,
  gpuPlots,
  kernelColours,
  PALETTE
} from '../admin';
import { GiB, NOW, pool, profiles, telemetry } from './fixtures';

describe('dashboardView', () => {
  it('lists every lease with user, notebook, profile, GPU, state, age and idle time', () => {
    const [bobs, alices, bobsHibernated] = pool().leases;
    const v = dashboardView(
      pool({
        leases: [
          {
            ...bobs,
            label: 'dir/b.ipynb',
            here: false,
            idle_since: NOW - 120,
            execution_state: 'idle',
            actions: ['release', 'hibernate', 'shutdown']
          },
          { ...alices, here: true, execution_state: 'busy', actions: ['release', 'shutdown'] },
          { ...bobsHibernated, actions: ['shutdown'] }
        ]
      }),
      NOW
    );
    assert.deepEqual(
      v.leases.map(l => [l.owner, l.notebook, l.profile, l.slice, l.gpu, l.state, l.age, l.idle]),
      [
        ['alice', 'a.ipynb', 'gpu-20g-50', '10 GiB · 50%', 'GPU 0', 'running', '1 min', 'busy'],
        ['bob', 'kernel k-bob-2', 'gpu-10g', '10 GiB', '–', 'hibernated', '2 h', '–'],
        ['bob', 'b.ipynb', 'gpu-10g', '10 GiB', 'GPU 0', 'active', '10 min', '2 min']
      ]
    );
    assert.deepEqual(
      v.leases[2].actions.map(a => a.label),
      ['Release', 'Hibernate', 'Shut down']
    );
    assert.match(v.leases[2].actions[2].title, /another Jupyter server/); // bob's runs elsewhere
    assert.doesNotMatch(v.leases[0].actions[0].title, /another Jupyter server/);
    assert.deepEqual(
      v.leases[0].actions.map(a => a.action),
      ['release', 'shutdown']
    ); // as the server allows
  });

  it('says "no GPU yet" for a kernel that never held a slice, never "hibernated"', () => {
    const [, , asleep] = pool().leases;
    const v = dashboardView(
      pool({
        leases: [
          { ...asleep, reason: 'first_cell' },
          { ...asleep, id: 'L4', kernel_id: 'k4', reason: 'idle' }
        ]
      }),
      NOW
    );
    assert.deepEqual(
      v.leases.map(l => l.state),
      ['no GPU yet', 'hibernated']
    );
  });

  it('orders the queue, shows GPUs and newest decisions first', () => {
    const v = dashboardView(pool(), NOW);
    assert.deepEqual(
      v.queue.map(q => [q.position, q.owner, q.notebook, q.what, q.waiting]),
      [
        [1, 'dave', 'dave-train.ipynb', 'resume', '1 min'],
        [2, 'carol', '–', 'start', '30 s']
      ]
    );
    assert.equal(v.gpus[0].memoryText, '20 GiB of 40 GiB held');
    assert.equal(v.gpus[0].fraction, 0.5);
    assert.equal(v.gpus[0].utilization, 'no reading');
    assert.equal(v.gpus[0].declared, true);
    assert.deepEqual(
      v.decisions.map(d => [
        d.kind,
        d.user,
        d.notebook,
        d.profile,
        d.action,
        d.reason,
        d.rule,
        d.dryRun
      ]),
      [
        [
          'hibernated',
          'alice',
          'a.ipynb',
          'gpu-20g-50',
          'hibernate',
          'GPU memory held, GPU unused',
          'default',
          false
        ],
        ['culled', 'bob', 'b0.ipynb', 'gpu-10g', 'shutdown', 'idle too long', 'students', true],
        ['warned', 'bob', 'b.ipynb', 'gpu-10g', 'shutdown', 'idle too long', 'students', false]
      ]
    );
    assert.match(v.decisions[0].time, /^\d\d:\d\d:\d\d$/);
  });

  it('lists everyone’s GPU time, the most spent first', () => {
    const v = dashboardView(
      pool({
        budgets: [
          {
            user: 'ann',
            scope: 'ann',
            kind: 'user',
            period: 'week',
            gpu_hours: 10,
            used_hours: 2,
            rate: 0,
            resets_at: NOW
          },
          {
            user: 'bob',
            scope: 'students',
            kind: 'member',
            period: 'week',
            gpu_hours: 10,
            used_hours: 9.5,
            rate: 0,
            resets_at: NOW
          }
        ]
      }),
      NOW
    );
    assert.deepEqual(
      v.budgets.map(b => [b.user, b.scope, b.text, b.level]),
      [
        ['bob', 'group students', '9.5 h of 10 h this week', 'near'],
        ['ann', 'own', '2 h of 10 h this week', 'ok']
      ]
    );
  });
});

describe('profile names', () => {
  it('names profiles as the launcher does where GET me knows them, by id otherwise', () => {
    const v = dashboardView(pool(), NOW, profiles({}));
    assert.deepEqual(
      v.leases.map(l => [l.profile, l.profileId]),
      [
        ['gpu-20g-50', 'gpu-20g-50'], // not one of this server's profiles: its id
        ['Python 3 · GPU 10 GiB', 'gpu-10g'],
        ['Python 3 · GPU 10 GiB', 'gpu-10g']
      ]
    );
    assert.deepEqual(
      v.decisions.map(d => d.profile),
      ['gpu-20g-50', 'Python 3 · GPU 10 GiB', 'Python 3 · GPU 10 GiB']
    );
    assert.deepEqual(
      v.queue.map(q => q.profile),
      ['Python 3 · GPU 10 GiB (10 GiB)', 'Python 3 · whole GPU (whole)']
    );
    // The log's search finds a row by either name.
    assert.equal(filterDecisions(v.decisions, { text: 'gpu-10g', kind: '', user: '' }).length, 2);
    assert.equal(
      filterDecisions(v.decisions, { text: 'GPU 10 GiB', kind: '', user: '' }).length,
      2
    );
  });
});

describe('filterDecisions', () => {
  const rows = dashboardView(pool(), NOW).decisions;
  it('filters by kind, by user and by words anywhere in the row', () => {
    assert.deepEqual(filterDecisions(rows, { text: '', kind: '', user: '' }).length, 3);
    assert.deepEqual(
      filterDecisions(rows, { text: '', kind: 'culled', user: '' }).map(r => r.notebook),
      ['b0.ipynb']
    );
    assert.deepEqual(
      filterDecisions(rows, { text: '', kind: '', user: 'alice' }).map(r => r.kind),
      ['hibernated']
    );
    assert.deepEqual(
      filterDecisions(rows, { text: 'students idle', kind: '', user: '' }).length,
      2
    );
    assert.deepEqual(
      filterDecisions(rows, { text: 'GPU unused', kind: '', user: '' }).map(r => r.user),
      ['alice']
    );
    assert.deepEqual(filterDecisions(rows, { text: 'nothing-like-this', kind: '', user: '' }), []);
  });
});

describe('gpuPlots', () => {
  it('stacks each kernel’s memory and utilization on its GPU over a shared time axis', () => {
    const [gpu0, gpu1] = gpuPlots(telemetry());
    assert.equal(gpu0.name, 'GPU 0');
    assert.equal(gpu0.slicesOnly, false); // bob's kernel has memory readings
    assert.deepEqual(gpu0.memory.times, [NOW - 10, NOW - 5, NOW]);
    assert.deepEqual(
      gpu0.memory.series.map(s => s.label),
      ['bob · b.ipynb', 'alice · a.ipynb']
    );
    // bob's readings; alice's kernel has none, so its slice's 10 GiB is what it holds.
    assert.deepEqual(gpu0.memory.series[0].values, [3, 4, 5]);
    assert.deepEqual(gpu0.memory.series[1].values, [null, 10, 10]);
    assert.deepEqual(gpu0.memory.series[1].stacked, [3, 14, 15]);
    assert.equal(gpu0.memory.max, 40);
    assert.deepEqual(gpu0.utilization.series[0].stacked, [20, 30, 40]);
    assert.deepEqual(gpu0.utilization.series[1].stacked, [20, 40, 40]);
    assert.equal(gpu0.utilization.max, 100);
    assert.equal(gpu0.utilization.summary, 'bob · b.ipynb 40%; alice · a.ipynb 10%');
    assert.equal(gpu0.memory.summary, 'bob · b.ipynb 5 GiB; alice · a.ipynb 10 GiB');
    assert.deepEqual(gpu1.memory.series, []);
    assert.equal(gpu1.memory.summary, 'no readings');
    assert.equal(gpu1.slicesOnly, false); // nothing on it: nothing to explain
  });

  it('gives each kernel of a GPU its own colour, the same in both plots and at every refresh', () => {
    // 'a' and 'k' hash to the same colour: the second kernel takes the next free one.
    assert.deepEqual(kernelColours(['a', 'k']), [PALETTE[7], PALETTE[8]]);
    assert.deepEqual(kernelColours(['a']), kernelColours(['a']));
    const many = kernelColours(Array.from({ length: 10 }, (_, i) => `kernel-${i}`));
    assert.equal(new Set(many).size, 10);
    const [gpu0] = gpuPlots(telemetry());
    assert.deepEqual(
      gpu0.memory.series.map(s => s.colour),
      gpu0.utilization.series.map(s => s.colour)
    );
    assert.notEqual(gpu0.memory.series[0].colour, gpu0.memory.series[1].colour);
  });

  it('holds each reading until the next one, so kernels sampled at other times stack evenly', () => {
    const t = telemetry();
    t.kernels[1].samples = [[NOW - 8, 2 * GiB, 50]]; // alice's one reading, between bob's
    const [gpu0] = gpuPlots(t);
    assert.deepEqual(gpu0.memory.times, [NOW - 10, NOW - 8, NOW - 5, NOW]);
    assert.deepEqual(gpu0.memory.series[0].values, [3, 3, 4, 5]); // bob's 3 GiB holds at NOW - 8
    assert.deepEqual(gpu0.memory.series[1].values, [null, 2, 2, 2]); // alice's holds until now
    assert.deepEqual(gpu0.memory.series[1].stacked, [3, 5, 6, 7]);
  });

  it('draws a kernel without readings (a declared GPU) as its slice, from when it took it', () => {
    const t = telemetry();
    t.kernels = [{ ...t.kernels[0], samples: [], held_since: NOW - 120 }];
    const [gpu0] = gpuPlots(t);
    assert.equal(gpu0.slicesOnly, true);
    assert.deepEqual(gpu0.memory.times, [NOW - 120, NOW]);
    assert.deepEqual(gpu0.memory.series[0].values, [10, 10]);
    assert.deepEqual(gpu0.utilization.series[0].values, [null, null]);
    t.kernels[0].held_since = NOW - 5000; // held for longer than the window: from the window's start
    assert.deepEqual(gpuPlots(t)[0].memory.times, [NOW - 600, NOW]);
  });

  it('agrees with the table: a whole GPU at what it holds, hibernated and ended kernels kept', () => {
    const t = telemetry();
    const base = { profile: 'gpu-10g', gpus: ['GPU-2'], slice_memory: 10 * GiB, samples: [] };
    t.kernels = [
      // The whole GPU, held for the whole window: 40 of 40 GiB, not 0.
      {
        ...base,
        kernel_id: 'k-whole',
        owner: 'carol',
        name: 'w.ipynb',
        profile: 'whole',
        slice_memory: null,
        whole: true,
        state: 'active',
        held: [[NOW - 600, null, ['GPU-1']]]
      },
      // Held on GPU 1 until it hibernated 100 s ago, and again (on GPU 1) from 50 s ago.
      {
        ...base,
        kernel_id: 'k-sleep',
        owner: 'bob',
        name: 's.ipynb',
        state: 'active',
        held: [
          [NOW - 300, NOW - 100, ['GPU-2']],
          [NOW - 50, null, ['GPU-2']]
        ]
      },
      // Shut down 200 s ago: its earlier points stay, its line drops to 0 from then on.
      {
        ...base,
        kernel_id: 'k-ended',
        owner: 'dan',
        name: 'e.ipynb',
        state: 'ended',
        held: [[NOW - 400, NOW - 200, ['GPU-2']]]
      }
    ];
    const [gpu0, gpu1] = gpuPlots(t);
    assert.deepEqual(gpu0.memory.series[0].values, [40, 40]);
    assert.equal(gpu0.memory.summary, 'carol · w.ipynb 40 GiB');
    assert.deepEqual(gpu1.memory.times, [
      NOW - 400,
      NOW - 300,
      NOW - 200,
      NOW - 100,
      NOW - 50,
      NOW
    ]);
    const [sleeper, ended] = gpu1.memory.series;
    assert.deepEqual(sleeper.values, [null, 10, 10, null, 10, 10]);
    assert.deepEqual(ended.values, [10, 10, null, null, null, null]);
    assert.deepEqual(ended.stacked, [10, 20, 10, 0, 10, 10]);
    assert.equal(ended.label, 'dan · e.ipynb (ended)');
    assert.equal(gpu1.memory.summary, 'bob · s.ipynb 10 GiB'); // nothing "now" for the ended one
    assert.deepEqual(gpu1.utilization.series[1].values, [null, null, null, null, null, null]);
    // The time axis is the whole window, whatever the readings.
    assert.deepEqual([gpu1.memory.from, gpu1.memory.to], [NOW - 600, NOW]);
    assert.deepEqual([gpu0.utilization.from, gpu0.utilization.to], [NOW - 600, NOW]);
  });
});

describe('the decision log in words', () => {
  it('says a resume was for the user’s cell, and a refused start is "a new kernel", not an id', () => {
    const resumed = decisionRow(
      {
        at: NOW,
        kind: 'resumed',
        kernel_id: 'k-1234567890',
        name: 'a.ipynb',
        reason: 'cell',
        message: ''
      },
      0
    );
    assert.equal(resumed.reason, 'a cell ran on it');
    assert.doesNotMatch(resumed.reason, /policy/);
    const refused = decisionRow(
      {
        at: NOW,
        kind: 'refused',
        kernel_id: 'k-1234567890',
        reason: 'pool_exhausted',
        message: ''
      },
      0
    );
    assert.equal(refused.notebook, 'a new kernel');
  });

  it('names a rule the admin gave no name by whom it covers, not "rule 0"', () => {
    const entry = { at: NOW, kind: 'culled', kernel_id: 'k-1', reason: 'idle', message: '' };
    assert.equal(
      decisionRow({ ...entry, rule: 'rule 0', rule_label: 'for group students' }, 0).rule,
      'for group students'
    );
    assert.equal(decisionRow({ ...entry, rule: 'lab' }, 0).rule, 'lab'); // a server without labels
  });
});
