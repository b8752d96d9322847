import assert from 'node:assert/strict';

import { Signal } from '@lumino/signaling';

import { PoolApiError } from '../api';
import { Hints } from '../hints';
import type { PoolModel } from '../model';
import type { IMe } from '../types';
import { historyLine, indicatorView, stateView, statusView } from '../view';
import { kernel, me, NOW, Screen } from './fixtures';

const SLEEPING = kernel({
  kernel_id: 'k-asleep',
  state: 'hibernated',
  gpus: [],
  actions: ['resume', 'shutdown']
});
const AWAKE = kernel({ kernel_id: 'k-awake' });
const ELSEWHERE = kernel({ kernel_id: 'k-other-server', state: 'hibernated', actions: [] });

/** The model as Hints reads it: GET me's last answer, its changed signal, and the client's hint. */
class Model {
  me: IMe | null = me({ kernels: [SLEEPING, AWAKE, ELSEWHERE] });
  changed = new Signal<this, void>(this);
  sent: string[] = [];
  refreshed = 0;
  answer: () => Promise<unknown> = () => Promise.resolve({ woken: true });
  client = {
    hint: (id: string) => {
      this.sent.push(id);
      return this.answer();
    }
  };
  refresh(): Promise<void> {
    this.refreshed += 1;
    return Promise.resolve();
  }
}

function setup(): { model: Model; hints: Hints; clock: { now: number } } {
  const model = new Model();
  const clock = { now: 1_000_000 };
  const hints = new Hints(model as unknown as PoolModel, 5000, () => clock.now);
  return { model, hints, clock };
}

const settle = () => new Promise(resolve => setTimeout(resolve, 0));

describe('Hints: resume before the cell runs', () => {
  it('hints only for a kernel GET me shows hibernated and resumable here', async () => {
    const { model, hints } = setup();
    hints.touch('k-awake');
    hints.touch('k-other-server');
    hints.touch('k-unknown');
    hints.touch(null);
    assert.deepEqual(model.sent, []);
    hints.touch('k-asleep');
    await settle();
    assert.deepEqual(model.sent, ['k-asleep']);
    assert.equal(model.refreshed, 1); // woken: GET me at once, so that "waking up…" shows
  });

  it('sends at most one hint a kernel every 5 s, however much the user types', async () => {
    const { model, hints, clock } = setup();
    for (let i = 0; i < 20; i++) {
      hints.touch('k-asleep');
      clock.now += 200;
    }
    assert.equal(model.sent.length, 1);
    clock.now += 1000; // 5 s after the first
    hints.touch('k-asleep');
    assert.equal(model.sent.length, 2);
  });

  it('remembers a notebook opened before the first GET me and hints once it answers', () => {
    const { model, hints } = setup();
    const answer = model.me;
    model.me = null;
    hints.touch('k-asleep');
    assert.deepEqual(model.sent, []);
    model.me = answer;
    model.changed.emit();
    model.changed.emit();
    assert.deepEqual(model.sent, ['k-asleep']);
  });

  it('stops hinting for as long as a 429 asks', async () => {
    const { model, hints, clock } = setup();
    model.answer = () =>
      Promise.reject(new PoolApiError(429, 'Too many hints', 'too_many_hints', 30));
    hints.touch('k-asleep');
    await settle();
    model.answer = () => Promise.resolve({ woken: false });
    model.me = me({ kernels: [SLEEPING, { ...SLEEPING, kernel_id: 'k-second' }] });
    hints.touch('k-second');
    clock.now += 29_000;
    hints.touch('k-asleep');
    assert.deepEqual(model.sent, ['k-asleep']);
    clock.now += 1_000;
    hints.touch('k-second');
    assert.deepEqual(model.sent, ['k-asleep', 'k-second']);
    await settle();
    assert.equal(model.refreshed, 0); // not woken: nothing to show
  });
});

describe('"waking up…", calmly', () => {
  const waking = kernel({ state: 'resuming', woken_on_hint: true, gpus: [] });

  it('is the card’s state, the toolbar’s word and the status bar’s progress while it resumes', () => {
    assert.equal(stateView(waking, NOW).label, 'waking up…');
    assert.equal(indicatorView(me({ kernels: [waking] }), waking.kernel_id).text, 'waking up…');
    assert.match(statusView(me({ kernels: [waking] }), null, NOW).text, /waking up…/);
    // a cell already waits on it: the usual words
    assert.match(stateView(waking, NOW, true).label, /^resuming/);
    // awake: the usual card
    assert.doesNotMatch(stateView({ ...waking, state: 'active' }, NOW).label, /waking/);
  });

  it('is never a toast, and What happened says it plainly', () => {
    const screen = new Screen();
    for (const [action, reason] of [
      ['resumed', 'hint'],
      ['hibernated', 'hint_unused']
    ]) {
      screen.book.fromEvent(
        { action, kernel_id: waking.kernel_id, user: 'alice', reason, message: '' },
        NOW
      );
      assert.deepEqual(screen.look().all, [], `${action} (${reason})`);
    }
    // GET me may list the ledger's own entry of the resume (no reason yet) while it is under way
    screen.book.fromState(
      me({
        kernels: [waking],
        recent: [
          { at: NOW + 1, kind: 'resumed', kernel_id: waking.kernel_id, reason: '', message: '' }
        ]
      })
    );
    assert.deepEqual(screen.look().all, []);
    const slept = historyLine({
      at: NOW,
      kind: 'hibernated',
      kernel_id: waking.kernel_id,
      reason: 'hint_unused',
      message: '',
      rule: 'hibernation'
    });
    assert.equal(slept, 'Back to sleep: woken in advance, but no cell ran; nothing was used.');
  });
});
