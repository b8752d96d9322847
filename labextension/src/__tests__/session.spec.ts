/**
 * A long session's cards stay true (its toasts: facts.spec.ts): no stale shutdown threat on a
 * resumed card, the pool said unreachable once the server stops answering, and an MPS profile said
 * to lose its variables.
 */
import assert from 'node:assert/strict';

import { formatWhen } from '../format';
import { profileHibernates, profileTooltip } from '../launcher';
import { warningMessage } from '../notices';
import { cardView, quotaBars, stateView, statusView, warningConsequence } from '../view';
import { kernel, me, NOW, profiles, Screen, warning } from './fixtures';

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
    const screen = new Screen();
    screen.book.fromState(me({ kernels: [k] }));
    assert.deepEqual(screen.look().all, []);
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
