/**
 * A long session's notices and cards stay true: one toast per happening however often it is
 * polled, a toast withdrawn when its fact changes, at most three on screen, no stale shutdown
 * threat on a resumed card, the pool said unreachable once the server stops answering, and an MPS
 * profile said to lose its variables.
 */
import assert from 'node:assert/strict';

import { formatWhen } from '../format';
import { profileHibernates, profileTooltip } from '../launcher';
import { MAX_ON_SCREEN, NoticeBook, toHide, warningMessage } from '../notices';
import type { IRecent } from '../types';
import { cardView, quotaBars, stateView, statusView, warningConsequence } from '../view';
import { kernel, me, NOW, profiles, warning } from './fixtures';

const resumed = (at: number): IRecent => ({
  at,
  kind: 'resumed',
  kernel_id: 'k1',
  name: 'a.ipynb',
  reason: 'cell',
  message: 'Resumed.'
});

describe('one toast per happening, in a long session', () => {
  it('never shows an older happening again once a newer one of the same kind came', () => {
    const book = new NoticeBook(NOW - 1);
    const k = kernel({ kernel_id: 'k1', name: 'a.ipynb' });
    // Resumed at NOW + 10 (event and poll), then again at NOW + 400: each once, in every later poll.
    assert.equal(
      book.fromEvent({ action: 'resumed', kernel_id: 'k1', reason: 'cell' }, NOW + 10).show.length,
      1
    );
    assert.equal(
      book.fromState(me({ now: NOW + 12, kernels: [k], recent: [resumed(NOW + 9)] })).show.length,
      0
    );
    const second = book.fromState(
      me({ now: NOW + 401, kernels: [k], recent: [resumed(NOW + 9), resumed(NOW + 400)] })
    );
    assert.deepEqual(
      second.show.map(n => n.key),
      [`resumed:k1:${NOW + 400}`]
    );
    // Minutes later both entries are still in `recent`: neither comes back.
    for (const t of [NOW + 600, NOW + 900, NOW + 1500]) {
      const later = book.fromState(
        me({ now: t, kernels: [k], recent: [resumed(NOW + 9), resumed(NOW + 400)] })
      );
      assert.deepEqual(later.show, [], `polled at +${t - NOW}s`);
    }
  });

  it('withdraws "‘X’ would start now" once X no longer starts, and never shows it again', () => {
    const book = new NoticeBook(NOW - 1);
    book.fromState(me({ profiles: profiles({ 'gpu-10g': true }) }));
    const event = {
      action: 'refused',
      kernel_id: 'k9',
      reason: 'pool_exhausted',
      profile: 'gpu-20g'
    };
    assert.deepEqual(book.fromEvent(event, NOW + 5).show, []); // explained from the GET me it triggers
    const entry: IRecent = {
      kind: 'refused',
      kernel_id: 'k9',
      reason: 'pool_exhausted',
      profile: 'gpu-20g',
      message: '',
      at: NOW + 5
    };
    const refused = book.fromState(
      me({ now: NOW + 6, profiles: profiles({ 'gpu-10g': true }), recent: [entry] })
    ).show[0];
    assert.match(refused.message, /‘Python 3 · GPU 10 GiB’ would start now\./);
    // The same answer from a poll: nothing withdrawn, nothing new.
    const same = book.fromState(
      me({ now: NOW + 8, profiles: profiles({ 'gpu-10g': true }), recent: [entry] })
    );
    assert.deepEqual(same, { show: [], dismiss: [] });
    // The pool filled up: the advice is false now.
    const full = book.fromState(me({ now: NOW + 20, profiles: profiles({}), recent: [entry] }));
    assert.deepEqual(full.dismiss, [refused.key]);
    assert.deepEqual(
      book.fromState(
        me({ now: NOW + 30, profiles: profiles({ 'gpu-10g': true }), recent: [entry] })
      ),
      {
        show: [],
        dismiss: []
      }
    );
  });

  it('keeps at most three toasts on screen: the oldest leave first, warnings last', () => {
    const shown = (n: number, warnings: number[] = []) =>
      Array.from({ length: n }, (_, i) => ({ id: `t${i}`, warning: warnings.includes(i) }));
    assert.equal(MAX_ON_SCREEN, 3);
    assert.deepEqual(toHide(shown(3)), []);
    assert.deepEqual(toHide(shown(5)), ['t0', 't1']);
    // t0 is a pending warning (the user can still stop it): the next oldest go instead.
    assert.deepEqual(toHide(shown(5, [0])), ['t1', 't2']);
    assert.deepEqual(toHide(shown(10, [0, 1, 2, 3])).length, 7);
    assert.deepEqual(toHide(shown(10, [0, 1, 2, 3])).slice(-1), ['t0']);
  });
});

describe('a resumed kernel’s card', () => {
  const stale = {
    ...warning,
    action: 'shutdown' as const,
    reason: 'max_hibernated',
    deadline: NOW + 3 * 86400
  };

  it('shows no "hibernated too long" deadline once the kernel has resumed', () => {
    const k = kernel({
      state: 'active',
      execution_state: 'idle',
      idle_since: NOW - 5,
      warning: stale,
      next_action: { action: 'shutdown', reason: 'max_hibernated', at: NOW + 20 }
    });
    const card = cardView(k, NOW);
    assert.equal(card.countdown, null);
    assert.doesNotMatch(card.state.detail, /shut down|hibernated too long/);
    assert.equal(warningConsequence(k), '');
    assert.equal(new NoticeBook(NOW - 1).fromState(me({ kernels: [k] })).show.length, 0);
    assert.doesNotMatch(statusView(me({ kernels: [k] }), null, NOW).title, /shut/);
    // Still hibernated, the same deadline is true and shown, with its date where it is not today.
    const asleep = cardView({ ...k, state: 'hibernated' }, NOW);
    assert.ok(asleep.countdown);
    assert.match(asleep.countdown.text, /^shuts down in /);
  });

  it('writes a deadline on another day with its date', () => {
    assert.match(formatWhen(NOW + 60, NOW), /^\d\d:\d\d$/);
    assert.match(formatWhen(NOW + 3 * 86400, NOW), /^\S+ \d+ \d\d:\d\d$/);
  });

  it('says "kept alive until 19:25, then hibernated if still idle" in one sentence', () => {
    const k = kernel({
      state: 'active',
      execution_state: 'idle',
      idle_since: NOW - 60,
      snoozed_until: NOW + 300,
      next_action: { action: 'hibernate', reason: 'idle', at: NOW + 300 }
    });
    const detail = stateView(k, NOW).detail;
    assert.match(detail, /^kept alive until \d\d:\d\d, then hibernated if still idle$/);
    assert.doesNotMatch(detail, /·/);
  });
});

describe('the server stopped answering', () => {
  it('says the pool cannot be reached, in grey, not the last held figure', () => {
    const state = me({ kernels: [kernel({ warning })] });
    const v = statusView(state, null, NOW + 60, NOW);
    assert.equal(v.text, 'GPU pool unreachable');
    assert.equal(v.level, 'lost');
    assert.match(
      v.title,
      /cannot be reached: the server has not answered since \d\d:\d\d\. Is Jupyter still running\?/
    );
    assert.doesNotMatch(v.text, /GPU mem/);
    // While it answers, the figures as before.
    assert.match(statusView(state, null, NOW).text, /^GPU mem/);
  });
});

describe('an MPS profile', () => {
  const mps = { ...profiles({})[0], isolation: 'mps', sm_percent: 50 };

  it('says on the launcher that it cannot hibernate and loses its variables', () => {
    assert.equal(profileHibernates(mps), false);
    assert.equal(profileHibernates(profiles({})[0]), true);
    assert.match(
      profileTooltip(mps, false),
      /cannot hibernate \(NVIDIA MPS\): an idle kernel of this kind is shut down and loses its variables/
    );
    assert.doesNotMatch(profileTooltip(profiles({})[0], false), /cannot hibernate/);
  });

  it('says in its warning that it cannot hibernate', () => {
    const k = kernel({ isolation: 'mps', warning: { ...warning, action: 'shutdown' } });
    assert.match(
      warningMessage(k),
      /shuts down at \d\d:\d\d.*: it cannot hibernate, its variables will be lost\./
    );
    assert.match(
      warningConsequence(k),
      /it cannot hibernate, so it shuts down and its variables will be lost/
    );
    assert.doesNotMatch(
      warningMessage(kernel({ warning: { ...warning, action: 'shutdown' } })),
      /cannot hibernate/
    );
  });
});

describe('quota without a limit', () => {
  it('is text, no empty bar', () => {
    const bars = quotaBars(me({ quota: { memory: null, kernels: null, sm_percent: null } }));
    assert.ok(bars.every(b => b.fraction === null && b.textOnly));
    assert.match(bars[0].text, /no limit/);
  });
});

describe('a card on a declared GPU', () => {
  it('says "declared" once: in the memory line, not again in the GPU line', () => {
    const k = kernel({
      state: 'active',
      execution_state: 'idle',
      gpus: [{ uuid: 'GPU-D0', label: 'GPU 0 · Demo GPU · 40 GiB (declared)', source: 'declared' }],
      memory_used: null
    });
    const v = cardView(k, NOW);
    assert.equal(v.gpu, 'GPU 0 · Demo GPU · 40 GiB');
    assert.equal(v.memory.note, 'no reading (declared GPU)');
  });
});
