import assert from 'node:assert/strict';

import {
  explanation,
  kernelOf,
  refusalAdvice,
  shortName,
  TOAST_LIMIT,
  warningMessage
} from '../notices';
import { kernel, me, NOW, profiles, Screen } from './fixtures';
import { IRecent } from '../types';

const warning = {
  action: 'shutdown' as const,
  reason: 'idle',
  message: 'Idle for 28 min.',
  deadline: NOW + 120,
  snoozes_left: 2,
  snooze_seconds: 1800
};

describe('warnings before a cull or hibernation', () => {
  it('says it is the kernel that goes, when (a time, not a stale countdown), what is lost and what to do', () => {
    const screen = new Screen();
    const state = me({ kernels: [kernel({ warning })] });
    screen.book.fromState(state);
    const first = screen.look().toasts;
    assert.equal(first.length, 1);
    const n = first[0];
    assert.equal(n.type, 'warning');
    assert.equal(n.nature, 'warning');
    assert.equal(n.keepAlive, true);
    assert.match(
      n.message,
      /^Untitled\.ipynb’s kernel shuts down at \d\d:\d\d \(idle too long\): its variables will be lost\. Run a cell or Keep alive to keep it\.$/
    );
    assert.doesNotMatch(n.message, /\(in \d/); // no countdown frozen in a toast
    // The next poll with the same warning: the same toast, nothing new.
    screen.book.fromState({ ...state, now: NOW + 3 });
    assert.deepEqual(
      screen.look().all.map(f => f.key),
      [n.key]
    );
  });

  it('says why a kernel was chosen for someone waiting, when, what it keeps, and offers Release now', () => {
    const screen = new Screen();
    const pressure = { ...warning, action: 'hibernate' as const, reason: 'pressure' };
    const chosen = kernel({ warning: pressure, idle_since: NOW - 25 * 60 });
    screen.book.fromState(me({ kernels: [chosen] }));
    const n = screen.look().toasts[0];
    assert.equal(n.type, 'warning');
    assert.equal(n.keepAlive, true);
    assert.equal(n.release, true);
    assert.match(
      n.message,
      /^Untitled\.ipynb’s kernel has been idle for 25 min and someone waits for a GPU: it hibernates at \d\d:\d\d, variables kept\. Run a cell to keep it\.$/
    );
    assert.ok(n.message.length <= TOAST_LIMIT);
    const shutdown = warningMessage(
      kernel({ warning: { ...pressure, action: 'shutdown' }, idle_since: NOW - 3 * 3600 }),
      NOW
    );
    assert.match(
      shutdown,
      /idle for 3 h and someone waits for a GPU: it shuts down at \d\d:\d\d, variables lost/
    );
    // A longer name: the reasons stay, in fewer words; the longest keeps why now and when.
    const longer = kernel({
      name: 'results-week-12.ipynb',
      warning: pressure,
      idle_since: NOW - 25 * 60
    });
    const fewer = warningMessage(longer, NOW);
    assert.ok(fewer.length <= TOAST_LIMIT, fewer);
    assert.match(
      fewer,
      /^results-week-12\.ipynb’s kernel, idle 25 min, hibernates at \d\d:\d\d for someone waiting for a GPU; variables kept\. Run a cell to keep it\.$/
    );
    const longest = kernel({
      name: 'x'.repeat(60) + '.ipynb',
      warning: pressure,
      idle_since: NOW - 25 * 60
    });
    const least = warningMessage(longest, NOW);
    assert.ok(least.length <= TOAST_LIMIT && !least.endsWith('…'), least);
    assert.match(
      least,
      /hibernates at \d\d:\d\d for someone waiting for a GPU; variables kept\. Run a cell/
    );
    // Other warnings offer no Release now; nor does a kernel that cannot be released from here.
    const toastOf = (state: ReturnType<typeof me>) => {
      const other = new Screen();
      other.book.fromState(state);
      return other.look().toasts[0];
    };
    assert.equal(toastOf(me({ kernels: [kernel({ warning })] })).release, false);
    const elsewhere = kernel({ warning: pressure, actions: [] });
    assert.equal(toastOf(me({ kernels: [elsewhere] })).release, false);
  });

  it('after the last snooze offers no Keep alive and says what the user can still do', () => {
    const screen = new Screen();
    screen.book.fromState(me({ kernels: [kernel({ warning: { ...warning, snoozes_left: 0 } })] }));
    const [out] = screen.look().toasts;
    assert.equal(out.keepAlive, false);
    assert.match(
      out.message,
      /its variables will be lost\. Run a cell to keep it, or save your work\.$/
    );
    assert.doesNotMatch(out.message, /Keep/);
  });

  it('replaces the warning when its last snooze is spent elsewhere (no stale Keep alive button)', () => {
    const screen = new Screen();
    screen.book.fromState(me({ kernels: [kernel({ warning })] }));
    const key = screen.look().toasts[0].key;
    screen.book.fromState(
      me({
        kernels: [
          kernel({ warning: { ...warning, snoozes_left: 0 }, actions: ['release', 'shutdown'] })
        ]
      })
    );
    const spent = screen.look().toasts;
    assert.equal(spent.length, 1);
    assert.notEqual(spent[0].key, key);
    assert.equal(spent[0].keepAlive, false);
  });

  it('dismisses the warning when it is snoozed away, and warns again for a new deadline', () => {
    const screen = new Screen();
    screen.book.fromState(me({ kernels: [kernel({ warning })] }));
    const key = screen.look().toasts[0].key;
    screen.book.fromState(me({ kernels: [kernel()] }));
    assert.deepEqual(screen.look().all, []); // a warning leaves no record: its outcome is one
    screen.book.fromState(
      me({ kernels: [kernel({ warning: { ...warning, deadline: NOW + 2000 } })] })
    );
    const again = screen.look().toasts;
    assert.equal(again.length, 1);
    assert.notEqual(again[0].key, key);
  });

  it('says what a hibernation keeps and that running a cell also keeps the slice', () => {
    const screen = new Screen();
    screen.book.fromState(
      me({ kernels: [kernel({ warning: { ...warning, action: 'hibernate' } })] })
    );
    assert.match(
      screen.look().toasts[0].message,
      /^Untitled\.ipynb’s kernel hibernates at \d\d:\d\d \(idle too long\): variables kept, slice given back\. Run a cell or Keep alive to keep it\.$/
    );
  });
});

describe('explanations afterwards', () => {
  const culled = (at: number): IRecent => ({
    at,
    kind: 'culled',
    kernel_id: kernel().kernel_id,
    name: 'analysis/Untitled.ipynb',
    reason: 'idle',
    message: 'Shut down.'
  });

  it('explains a cull plainly, offers a new kernel, withdraws the warning, and says it once however reported', () => {
    const screen = new Screen();
    screen.book.fromState(me({ kernels: [kernel({ warning })] }));
    const warned = screen.look().toasts[0];
    screen.book.fromEvent(
      {
        action: 'culled',
        kernel_id: kernel().kernel_id,
        user: 'alice',
        reason: 'idle',
        message: 'Shut down.'
      },
      NOW + 120
    );
    const [n] = screen.look().toasts;
    assert.notEqual(n.key, warned.key);
    assert.equal(n.type, 'warning');
    assert.equal(n.nature, 'loss');
    assert.equal(n.newKernel, true);
    assert.equal(
      n.message,
      'Untitled.ipynb’s kernel was shut down (idle too long): its variables are gone. Start a new kernel and run your cells again.'
    );
    // The poll reports it too: one happening, one toast.
    screen.book.fromState(me({ now: NOW + 122, kernels: [], recent: [culled(NOW + 119.5)] }));
    assert.deepEqual(
      screen.look().all.map(f => f.key),
      [n.key]
    );
  });

  it('records a hibernation once, marked where the GPU is declared, never as a toast', () => {
    const screen = new Screen();
    const state = me({
      kernels: [],
      recent: [
        {
          at: NOW - 500,
          kind: 'culled',
          kernel_id: 'old',
          name: 'old.ipynb',
          message: 'before this page'
        },
        {
          at: NOW + 5,
          kind: 'hibernated',
          kernel_id: 'k2',
          name: 'dir/b.ipynb',
          reason: 'idle',
          message: 'Hibernated.',
          declared: true
        }
      ]
    });
    screen.book.fromState(state);
    screen.book.fromState(state);
    const { toasts, records } = screen.look();
    assert.deepEqual(toasts, []);
    assert.equal(records.length, 1);
    assert.match(
      records[0].record!,
      /^At \d\d:\d\d, b\.ipynb’s kernel hibernated \(idle too long\): its variables were kept \(declared: no GPU memory to move\)\.$/
    );
  });

  it('names a refused start by its launcher name, with advice for a kernel-count limit', () => {
    const screen = new Screen();
    const refused: IRecent = {
      at: NOW + 1,
      kind: 'refused',
      kernel_id: 'k9',
      reason: 'quota_exceeded',
      profile: 'gpu-20g',
      message: '…'
    };
    screen.book.fromState(
      me({
        now: NOW + 2,
        quota: { memory: null, sm_percent: null, kernels: 2 },
        usage: { memory: 20 * 2 ** 30, sm_percent: 0, kernels: 2 },
        profiles: profiles({ 'gpu-10g': true }),
        recent: [refused]
      })
    );
    const [n] = screen.look().toasts;
    assert.equal(n.type, 'error');
    assert.equal(
      n.message,
      '‘Python 3 · GPU 20 GiB’ could not start: your GPU quota is used up. You hold 2 of 2 GPU kernels: shut one down first.'
    );
    assert.doesNotMatch(n.message, /smaller/);
  });

  it('fits refusal advice to the limit hit: what would start now, or what to do', () => {
    const withRoom = me({ profiles: profiles({ 'gpu-10g': true }) });
    assert.equal(
      refusalAdvice('quota_exceeded', withRoom, 'gpu-20g'),
      '‘Python 3 · GPU 10 GiB’ would start now.'
    );
    assert.equal(
      refusalAdvice('pool_exhausted', withRoom, 'gpu-20g'),
      '‘Python 3 · GPU 10 GiB’ would start now.'
    );
    const full = me({ profiles: profiles({}) });
    assert.equal(
      refusalAdvice('pool_exhausted', full, 'gpu-20g'),
      'Try again when an idle kernel gives its slice back.'
    );
    assert.equal(
      refusalAdvice('quota_exceeded', full, 'gpu-20g'),
      'Shut a GPU kernel down to make room in your quota.'
    );
    const noGpus = me({ pool: { enabled: true, note: 'no GPUs', gpus: 0 } });
    assert.equal(refusalAdvice('pool_exhausted', noGpus), 'The pool has no GPUs: tell your admin.');
    assert.doesNotMatch(refusalAdvice('pool_exhausted', noGpus), /try again|smaller/i);
    assert.match(refusalAdvice('something-new', null), /GPU panel/);
  });

  it('never toasts the wake of a kernel asleep between cells (its cell says it), pushed or polled', () => {
    const screen = new Screen();
    const between = kernel({ kernel_id: 'k', sleeps_after_cell: 30 });
    const resumed: IRecent = {
      kind: 'resumed',
      kernel_id: 'k',
      reason: 'cell',
      message: 'Resumed.',
      at: NOW
    };
    screen.book.fromState(me({ kernels: [between], recent: [resumed] }));
    screen.book.fromEvent({ action: 'resumed', kernel_id: 'k', reason: 'cell' }, NOW + 5);
    assert.deepEqual(screen.look().all, []);
    // another kernel's wake on a cell is on record as before (no toast)
    screen.book.fromEvent({ action: 'resumed', kernel_id: 'other', reason: 'cell' }, NOW + 6);
    assert.equal(screen.look().records.length, 1);
  });

  it('tells the user when an admin shut their kernel down', () => {
    const screen = new Screen();
    screen.book.fromEvent(
      { action: 'released', kernel_id: 'k4', reason: 'admin', message: '…' },
      NOW
    );
    const [n] = screen.look().toasts;
    assert.match(
      n.message,
      /was shut down to give its GPU slice back \(an admin asked\): its variables are gone\./
    );
    assert.equal(n.newKernel, true);
  });

  it('explains a kernel whose process ended and whose slice was reclaimed', () => {
    const screen = new Screen();
    screen.book.fromState(
      me({
        kernels: [],
        recent: [
          {
            at: NOW + 1,
            kind: 'reclaimed',
            kernel_id: 'k3',
            name: 'c.ipynb',
            reason: 'holder gone',
            message: '…'
          }
        ]
      })
    );
    assert.deepEqual(screen.toasts(), [
      'c.ipynb’s kernel ended, so its GPU slice went back to the pool.'
    ]);
  });

  it('keeps every toast within JupyterLab’s 140 characters, even for a long notebook name', () => {
    const long = 'a-very-long-folder/' + 'x'.repeat(80) + '.ipynb';
    assert.equal(shortName(long).length, 28);
    assert.ok(kernelOf(long).endsWith('’s kernel'));
    const state = me({ profiles: profiles({ 'gpu-10g': true, 'gpu-20g': true }) });
    const kinds = [
      'culled',
      'hibernated',
      'refused',
      'resumed',
      'queued',
      'reclaimed',
      'released',
      'over_memory',
      'novel'
    ];
    const reasons = [
      'idle',
      'gpu_idle',
      'max_busy',
      'max_age',
      'max_hibernated',
      'over_memory',
      'quota_exceeded',
      'pool_exhausted',
      'queue_timeout',
      'budget_exceeded',
      'pressure'
    ];
    for (const kind of kinds) {
      for (const reason of reasons) {
        for (const declared of [false, true]) {
          const text = explanation(kind, long, reason, kind === 'novel' ? 'x'.repeat(300) : '', {
            me: state,
            profile: 'gpu-whole',
            declared
          });
          assert.ok(
            text.length <= TOAST_LIMIT,
            `${kind}/${reason}: ${text.length} > ${TOAST_LIMIT}: ${text}`
          );
          if (kind !== 'novel') {
            // Written to fit: nothing of ours is cut off (only the name is shortened).
            assert.ok(!text.endsWith('…'), text);
          }
        }
      }
    }
    for (const action of ['shutdown', 'hibernate'] as const) {
      for (const reason of reasons) {
        for (const snoozes of [0, 2]) {
          const k = kernel({
            name: long,
            warning: {
              ...warning,
              action,
              reason,
              snoozes_left: snoozes,
              deadline: NOW + 86400 * 3
            }
          });
          const text = warningMessage(k);
          assert.ok(text.length <= TOAST_LIMIT, `${action}/${reason}: ${text.length}: ${text}`);
          assert.ok(!text.endsWith('…'), text);
          if (reason !== 'over_memory' && reason !== 'budget_exceeded') {
            assert.match(text, /Run a cell/);
          }
        }
      }
    }
  });

  it('keeps the reason where the notebook’s name leaves room for it', () => {
    const short = warningMessage(
      kernel({ name: 'a.ipynb', warning: { ...warning, action: 'hibernate', reason: 'gpu_idle' } })
    );
    assert.match(short, /\(GPU memory held, GPU unused\)/);
    const culled = explanation('culled', 'a.ipynb', 'max_busy', '', {});
    assert.equal(
      culled,
      'a.ipynb’s kernel was shut down (busy longer than allowed): its variables are gone. Start a new kernel and run your cells again.'
    );
  });

  it('says a hibernation or resume failed and where to read more, not that a kernel could not start', () => {
    const screen = new Screen();
    screen.book.fromState(
      me({ profiles: profiles({ 'gpu-10g': true }), kernels: [kernel({ kernel_id: 'k9' })] })
    );
    screen.book.fromEvent(
      {
        action: 'refused',
        kernel_id: 'k9',
        reason: 'hibernation_failed',
        profile: 'gpu-10g',
        message: '…'
      },
      NOW
    );
    const [n] = screen.look().toasts;
    assert.equal(n.type, 'error');
    assert.match(
      n.message,
      /: a hibernation or resume failed\. The GPU panel’s “What happened” says/
    );
    assert.doesNotMatch(n.message, /could not start/);
    const long = explanation('refused', 'x'.repeat(200) + '.ipynb', 'hibernation_failed', '', {});
    assert.ok(long.length <= 140 && long.includes('a hibernation or resume failed'), long);
  });

  it('says a refused first cell could not take its GPU slice, not that it could not resume', () => {
    const text = explanation('refused', 'a.ipynb', 'quota_exceeded', '', { action: 'first_cell' });
    assert.match(
      text,
      /^a\.ipynb’s kernel could not take its GPU slice, so its cell did not run: /
    );
    assert.doesNotMatch(text, /resume|variables/);
  });

  it('says a kernel ended with its server, not that it was shut down to give its slice back', () => {
    assert.equal(
      explanation('released', 'a.ipynb', 'server_stopped', '', {
        action: 'shutdown',
        withServer: true
      }),
      'a.ipynb’s kernel ended when the server stopped: its variables are gone.'
    );
  });
});
