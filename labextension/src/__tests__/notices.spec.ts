import assert from 'node:assert/strict';

import {
  explanation,
  kernelOf,
  NoticeBook,
  refusalAdvice,
  shortName,
  TOAST_LIMIT,
  warningMessage
} from '../notices';
import { kernel, me, NOW, profiles } from './fixtures';
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
    const book = new NoticeBook(NOW - 1);
    const state = me({ kernels: [kernel({ warning })] });
    const first = book.fromState(state);
    assert.equal(first.show.length, 1);
    const n = first.show[0];
    assert.equal(n.type, 'warning');
    assert.equal(n.keepAlive, true);
    assert.equal(n.autoClose, false);
    assert.match(
      n.message,
      /^Untitled\.ipynb’s kernel shuts down at \d\d:\d\d \(idle too long\): its variables will be lost\. Run a cell or Keep alive to keep it\.$/
    );
    assert.doesNotMatch(n.message, /\(in \d/); // no countdown frozen in a toast
    // The next poll with the same warning shows nothing new.
    assert.deepEqual(book.fromState({ ...state, now: NOW + 3 }), { show: [], dismiss: [] });
  });

  it('says why a kernel was chosen for someone waiting, when, what it keeps, and offers Release now', () => {
    const book = new NoticeBook(NOW - 1);
    const pressure = { ...warning, action: 'hibernate' as const, reason: 'pressure' };
    const chosen = kernel({ warning: pressure, idle_since: NOW - 25 * 60 });
    const n = book.fromState(me({ kernels: [chosen] })).show[0];
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
    assert.notEqual(
      new NoticeBook(NOW - 1).fromState(me({ kernels: [kernel({ warning })] })).show[0].release,
      true
    );
    const elsewhere = kernel({ warning: pressure, actions: [] });
    assert.equal(
      new NoticeBook(NOW - 1).fromState(me({ kernels: [elsewhere] })).show[0].release,
      false
    );
  });

  it('after the last snooze offers no Keep alive and says what the user can still do', () => {
    const book = new NoticeBook(NOW - 1);
    const out = book.fromState(
      me({ kernels: [kernel({ warning: { ...warning, snoozes_left: 0 } })] })
    );
    assert.equal(out.show[0].keepAlive, false);
    assert.match(
      out.show[0].message,
      /its variables will be lost\. Run a cell to keep it, or save your work\.$/
    );
    assert.doesNotMatch(out.show[0].message, /Keep/);
  });

  it('replaces the warning when its last snooze is spent elsewhere (no stale Keep alive button)', () => {
    const book = new NoticeBook(NOW - 1);
    const key = book.fromState(me({ kernels: [kernel({ warning })] })).show[0].key;
    const spent = book.fromState(
      me({
        kernels: [
          kernel({ warning: { ...warning, snoozes_left: 0 }, actions: ['release', 'shutdown'] })
        ]
      })
    );
    assert.deepEqual(spent.dismiss, [key]);
    assert.equal(spent.show.length, 1);
    assert.equal(spent.show[0].keepAlive, false);
  });

  it('dismisses the warning when it is snoozed away, and warns again for a new deadline', () => {
    const book = new NoticeBook(NOW - 1);
    const key = book.fromState(me({ kernels: [kernel({ warning })] })).show[0].key;
    const snoozed = book.fromState(me({ kernels: [kernel()] }));
    assert.deepEqual(snoozed, { show: [], dismiss: [key] });
    const again = book.fromState(
      me({ kernels: [kernel({ warning: { ...warning, deadline: NOW + 2000 } })] })
    );
    assert.equal(again.show.length, 1);
    assert.notEqual(again.show[0].key, key);
  });

  it('says what a hibernation keeps and that running a cell also keeps the slice', () => {
    const book = new NoticeBook(NOW - 1);
    const out = book.fromState(
      me({ kernels: [kernel({ warning: { ...warning, action: 'hibernate' } })] })
    );
    assert.match(
      out.show[0].message,
      /^Untitled\.ipynb’s kernel hibernates at \d\d:\d\d \(idle too long\): variables kept, slice given back\. Run a cell or Keep alive to keep it\.$/
    );
  });
});

describe('explanations afterwards', () => {
  it('explains a cull plainly, offers a new kernel and dismisses the warning', () => {
    const book = new NoticeBook(NOW - 1);
    const warnKey = book.fromState(me({ kernels: [kernel({ warning })] })).show[0].key;
    const out = book.fromEvent(
      {
        action: 'culled',
        kernel_id: kernel().kernel_id,
        user: 'alice',
        reason: 'idle',
        message: 'Shut down.'
      },
      NOW + 120
    );
    assert.deepEqual(out.dismiss, [warnKey]);
    assert.equal(out.show.length, 1);
    const n = out.show[0];
    assert.equal(n.type, 'warning');
    assert.equal(n.kernelGone, true);
    assert.equal(n.newKernel, true);
    assert.equal(
      n.message,
      'Untitled.ipynb’s kernel was shut down (idle too long): its variables are gone. Start a new kernel and run your cells again.'
    );
  });

  it('shows a happening once when both the event and the polled `recent` report it', () => {
    const book = new NoticeBook(NOW - 1);
    const kid = kernel().kernel_id;
    assert.equal(
      book.fromEvent({ action: 'culled', kernel_id: kid, message: 'Shut down.' }, NOW + 10).show
        .length,
      1
    );
    const polled = book.fromState(
      me({
        now: NOW + 12,
        kernels: [],
        recent: [
          {
            at: NOW + 9,
            kind: 'culled',
            kernel_id: kid,
            name: 'a.ipynb',
            reason: 'idle',
            message: 'Shut down.'
          }
        ]
      })
    );
    assert.deepEqual(polled.show, []);
  });

  it('explains a hibernation from `recent` once, marked where the GPU is declared', () => {
    const book = new NoticeBook(NOW - 1);
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
    const out = book.fromState(state);
    assert.equal(out.show.length, 1);
    assert.equal(out.show[0].type, 'info');
    assert.equal(out.show[0].kernelGone, false); // a hibernated kernel lives on
    assert.equal(
      out.show[0].message,
      'b.ipynb’s kernel hibernated (idle too long): its variables are kept (declared: no GPU memory to move). Run a cell to resume it.'
    );
    assert.deepEqual(book.fromState(state).show, []);
  });

  it('names a refused start by its launcher name, with advice for a kernel-count limit', () => {
    const book = new NoticeBook(NOW - 1);
    book.fromState(
      me({
        quota: { memory: null, sm_percent: null, kernels: 2 },
        usage: { memory: 20 * 2 ** 30, sm_percent: 0, kernels: 2 },
        profiles: profiles({ 'gpu-10g': true })
      })
    );
    const out = book.fromEvent(
      {
        action: 'refused',
        kernel_id: 'k9',
        reason: 'quota_exceeded',
        profile: 'gpu-20g',
        message: '…'
      },
      NOW
    );
    assert.equal(out.show[0].type, 'error');
    assert.equal(
      out.show[0].message,
      '‘Python 3 · GPU 20 GiB’ could not start: your GPU quota is used up. You hold 2 of 2 GPU kernels: shut one down first.'
    );
    assert.doesNotMatch(out.show[0].message, /smaller/);
  });

  it('explains a refusal pushed after the last GET me from the next one, never with stale advice', () => {
    const book = new NoticeBook(NOW - 1);
    book.fromState(me({ profiles: profiles({ 'gpu-20g': true, 'gpu-10g': true }) })); // before the pool filled
    const event = {
      action: 'refused',
      kernel_id: '',
      reason: 'pool_exhausted',
      profile: 'gpu-20g',
      message: '…'
    };
    assert.deepEqual(book.fromEvent(event, NOW + 2).show, []); // its advice would be stale: wait for GET me
    const refused: IRecent = {
      kind: 'refused',
      kernel_id: '',
      reason: 'pool_exhausted',
      profile: 'gpu-20g',
      message: '…',
      at: NOW + 2
    };
    const later = book.fromState(
      me({ now: NOW + 3, profiles: profiles({ 'gpu-10g': true }), recent: [refused] })
    );
    assert.equal(later.show.length, 1);
    assert.match(later.show[0].message, /‘Python 3 · GPU 10 GiB’ would start now/);
    assert.deepEqual(
      book.fromState(
        me({ now: NOW + 8, profiles: profiles({ 'gpu-10g': true }), recent: [refused] })
      ).dismiss,
      []
    );
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

  it('replaces a kernel’s explanation with the next one (hibernated, then resumed)', () => {
    const book = new NoticeBook(NOW - 1);
    const hibernated = book.fromEvent(
      { action: 'hibernated', kernel_id: 'k', reason: 'idle' },
      NOW
    );
    const resumed = book.fromEvent({ action: 'resumed', kernel_id: 'k', reason: 'cell' }, NOW + 30);
    assert.equal(resumed.show[0].type, 'success');
    assert.deepEqual(resumed.dismiss, [hibernated.show[0].key]);
    const other = book.fromEvent(
      { action: 'hibernated', kernel_id: 'other', reason: 'idle' },
      NOW + 31
    );
    assert.deepEqual(other.dismiss, []); // another kernel's toast stays
  });

  it('never toasts the wake of a kernel asleep between cells (its cell says it), pushed or polled', () => {
    const book = new NoticeBook(NOW - 1);
    const between = kernel({ kernel_id: 'k', sleeps_after_cell: 30 });
    const resumed: IRecent = {
      kind: 'resumed',
      kernel_id: 'k',
      reason: 'cell',
      message: 'Resumed.',
      at: NOW
    };
    const state = book.fromState(me({ kernels: [between], recent: [resumed] }));
    assert.deepEqual(state.show, []);
    assert.deepEqual(
      book.fromEvent({ action: 'resumed', kernel_id: 'k', reason: 'cell' }, NOW + 5).show,
      []
    );
    // another kernel's wake on a cell is news as before
    assert.equal(
      book.fromEvent({ action: 'resumed', kernel_id: 'other', reason: 'cell' }, NOW + 6).show
        .length,
      1
    );
  });

  it('ignores dry runs, the user’s own releases and non-explained actions', () => {
    const book = new NoticeBook(NOW - 1);
    assert.deepEqual(
      book.fromEvent({ action: 'culled', kernel_id: 'a', dry_run: true }, NOW).show,
      []
    );
    assert.deepEqual(
      book.fromEvent({ action: 'released', kernel_id: 'a', reason: 'user' }, NOW).show,
      []
    );
    assert.deepEqual(book.fromEvent({ action: 'warned', kernel_id: 'a' }, NOW).show, []);
    assert.deepEqual(book.fromEvent({ action: 'snoozed', kernel_id: 'a' }, NOW).show, []);
  });

  it('tells the user when an admin shut their kernel down', () => {
    const book = new NoticeBook(NOW - 1);
    const out = book.fromEvent(
      { action: 'released', kernel_id: 'k4', reason: 'admin', message: '…' },
      NOW
    );
    assert.match(
      out.show[0].message,
      /was shut down to give its GPU slice back \(an admin asked\): its variables are gone\./
    );
    assert.equal(out.show[0].newKernel, true);
  });

  it('explains a kernel whose process ended and whose slice was reclaimed', () => {
    const book = new NoticeBook(NOW - 1);
    const out = book.fromState(
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
    assert.equal(
      out.show[0].message,
      'c.ipynb’s kernel ended, so its GPU slice went back to the pool.'
    );
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
    const book = new NoticeBook(NOW - 1);
    book.fromState(me({ profiles: profiles({ 'gpu-10g': true }) }));
    const out = book.fromEvent(
      {
        action: 'refused',
        kernel_id: 'k9',
        reason: 'hibernation_failed',
        profile: 'gpu-10g',
        message: '…'
      },
      NOW
    );
    assert.equal(out.show[0].type, 'error');
    assert.match(
      out.show[0].message,
      /: a hibernation or resume failed\. The GPU panel’s “What happened” says/
    );
    assert.doesNotMatch(out.show[0].message, /could not start/);
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
