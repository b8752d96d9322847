import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import {
  explanation,
  NoticeBook,
  reasonPhrase,
  refusalAdvice,
  shortName,
  TOAST_LIMIT,
  warningMessage
} from '../notices';
import { kernel, me, NOW } from './fixtures';

const warning = {
  action: 'shutdown' as const,
  reason: 'idle',
  message: 'Idle for 28 min.',
  deadline: NOW + 120,
  snoozes_left: 2,
  snooze_seconds: 1800
};

describe('NoticeBook warnings', () => {
  it('warns once per pending action, with Keep alive, and never auto-closes', () => {
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
      /^Untitled\.ipynb shuts down at \d\d:\d\d \(in 2 min\): idle too long\. Keep it alive to hold its GPU slice\.$/
    );
    // The next poll with the same warning shows nothing new.
    assert.deepEqual(book.fromState({ ...state, now: NOW + 3 }), { show: [], dismiss: [] });
  });

  it('dismisses the warning when it is snoozed away, and warns again for a new deadline', () => {
    const book = new NoticeBook(NOW - 1);
    const key = book.fromState(me({ kernels: [kernel({ warning })] })).show[0].key;
    const snoozed = book.fromState(me({ kernels: [kernel()] }));
    assert.deepEqual(snoozed, { show: [], dismiss: [key] });
    const again = book.fromState(me({ kernels: [kernel({ warning: { ...warning, deadline: NOW + 2000 } })] }));
    assert.equal(again.show.length, 1);
    assert.notEqual(again.show[0].key, key);
  });

  it('offers no Keep alive when no snoozes are left', () => {
    const book = new NoticeBook(NOW - 1);
    const out = book.fromState(me({ kernels: [kernel({ warning: { ...warning, snoozes_left: 0 } })] }));
    assert.equal(out.show[0].keepAlive, false);
  });

  it('says "hibernated" with what is kept for a hibernation warning', () => {
    const book = new NoticeBook(NOW - 1);
    const out = book.fromState(me({ kernels: [kernel({ warning: { ...warning, action: 'hibernate' } })] }));
    assert.match(out.show[0].message, /hibernates at .*: idle too long\. It keeps its variables, not its GPU slice\.$/);
  });
});

describe('NoticeBook explanations', () => {
  it('explains a cull from the pushed event and dismisses its warning', () => {
    const book = new NoticeBook(NOW - 1);
    const warnKey = book.fromState(me({ kernels: [kernel({ warning })] })).show[0].key;
    const out = book.fromEvent(
      {
        action: 'culled',
        kernel_id: kernel().kernel_id,
        user: 'alice',
        reason: 'idle',
        message: 'Shut down after 30 min idle to give its GPU slice back.'
      },
      NOW + 120
    );
    assert.deepEqual(out.dismiss, [warnKey]);
    assert.equal(out.show.length, 1);
    assert.equal(out.show[0].type, 'warning');
    assert.equal(out.show[0].kernelGone, true);
    assert.equal(
      out.show[0].message,
      'Untitled.ipynb was shut down to free its GPU slice (idle too long). Start a kernel again to go on.'
    );
  });

  it('shows a happening once when both the event and the polled `recent` report it', () => {
    const book = new NoticeBook(NOW - 1);
    const kid = kernel().kernel_id;
    assert.equal(book.fromEvent({ action: 'culled', kernel_id: kid, message: 'Shut down.' }, NOW + 10).show.length, 1);
    const polled = book.fromState(
      me({ now: NOW + 12, kernels: [], recent: [{ at: NOW + 9, kind: 'culled', kernel_id: kid, name: 'a.ipynb', reason: 'idle', message: 'Shut down.' }] })
    );
    assert.deepEqual(polled.show, []);
  });

  it('explains what happened while the event stream was down, from `recent`, once', () => {
    const book = new NoticeBook(NOW - 1);
    const state = me({
      kernels: [],
      recent: [
        { at: NOW - 500, kind: 'culled', kernel_id: 'old', name: 'old.ipynb', message: 'before this page' },
        { at: NOW + 5, kind: 'hibernated', kernel_id: 'k2', name: 'dir/b.ipynb', reason: 'idle', message: 'Hibernated after 10 min idle.' }
      ]
    });
    const out = book.fromState(state);
    assert.equal(out.show.length, 1);
    assert.equal(out.show[0].type, 'info');
    assert.equal(out.show[0].kernelGone, false); // a hibernated kernel lives on
    assert.equal(
      out.show[0].message,
      'b.ipynb hibernated (idle too long); its variables are kept. Run a cell or Resume to go on.'
    );
    assert.deepEqual(book.fromState(state).show, []);
  });

  it('turns a refusal into an error that says what to do', () => {
    const book = new NoticeBook(NOW - 1);
    const out = book.fromEvent(
      {
        action: 'refused',
        kernel_id: 'k9',
        reason: 'quota_exceeded',
        message: 'Your GPU quota is used up: you hold 40 GiB of 40 GiB.'
      },
      NOW
    );
    assert.equal(out.show[0].type, 'error');
    assert.equal(
      out.show[0].message,
      'A GPU kernel could not start: your GPU quota is used up. ' +
        'Release or shut down one of your GPU kernels, or pick a smaller GPU profile.'
    );
    assert.match(refusalAdvice('pool_exhausted'), /Try again soon/);
    assert.match(refusalAdvice('something-new'), /GPU panel/);
  });

  it('ignores dry runs, the user’s own releases and non-explained actions', () => {
    const book = new NoticeBook(NOW - 1);
    assert.deepEqual(book.fromEvent({ action: 'culled', kernel_id: 'a', dry_run: true }, NOW).show, []);
    assert.deepEqual(book.fromEvent({ action: 'released', kernel_id: 'a', reason: 'user' }, NOW).show, []);
    assert.deepEqual(book.fromEvent({ action: 'warned', kernel_id: 'a' }, NOW).show, []);
    assert.deepEqual(book.fromEvent({ action: 'snoozed', kernel_id: 'a' }, NOW).show, []);
  });

  it('explains a kernel whose process ended and whose slice was reclaimed', () => {
    const book = new NoticeBook(NOW - 1);
    const out = book.fromState(
      me({ kernels: [], recent: [{ at: NOW + 1, kind: 'reclaimed', kernel_id: 'k3', name: 'c.ipynb', reason: 'holder gone', message: 'Lease released: holder gone' }] })
    );
    assert.equal(out.show[0].message, 'c.ipynb: its kernel process ended, so its GPU slice went back to the pool.');
  });

  it('keeps every toast within JupyterLab’s 140 characters, even for a long notebook name', () => {
    const long = 'a-very-long-folder/' + 'x'.repeat(80) + '.ipynb';
    assert.equal(shortName(long).length, 32);
    const kinds = ['culled', 'hibernated', 'refused', 'resumed', 'queued', 'reclaimed', 'released', 'over_memory', 'novel'];
    const reasons = ['idle', 'gpu_idle', 'max_busy', 'max_age', 'max_hibernated', 'over_memory', 'quota_exceeded', 'pool_exhausted', 'queue_timeout'];
    for (const kind of kinds) {
      for (const reason of reasons) {
        const text = explanation(kind, long, reason, kind === 'novel' ? 'x'.repeat(300) : '');
        assert.ok(text.length <= TOAST_LIMIT, `${kind}/${reason}: ${text.length} > ${TOAST_LIMIT}: ${text}`);
        if (kind !== 'novel') {
          // Written to fit: nothing of ours is cut off (only the name is shortened).
          assert.ok(!text.endsWith('…'), text);
        }
      }
    }
    for (const action of ['shutdown', 'hibernate'] as const) {
      for (const reason of reasons) {
        const k = kernel({ name: long, warning: { ...warning, action, reason, deadline: NOW + 86400 * 3 } });
        const text = warningMessage(k, NOW);
        assert.ok(text.length <= TOAST_LIMIT, `${action}/${reason}: ${text.length}: ${text}`);
        assert.ok(!text.endsWith('…'), text);
      }
    }
  });

  it('says why in a few words, and passes an unknown reason through readably', () => {
    assert.equal(reasonPhrase('gpu_idle'), 'GPU memory held, GPU unused');
    assert.equal(reasonPhrase('new_reason'), 'new reason');
    assert.equal(reasonPhrase(undefined), 'the pool’s policy');
  });
});
