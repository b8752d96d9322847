/**
 * A kernel whose rule says `hibernate_after_cell` holds its GPU only while cells run: it goes to
 * sleep unwarned a few seconds after each cell. The card says so calmly, no toast announces it, and
 * "What happened" says it plainly.
 */

import assert from 'node:assert/strict';

import { reasonPhrase } from '../words';
import { historyLine, indicatorView, stateView } from '../view';
import { kernel, me, NOW, Screen } from './fixtures';

const BETWEEN = kernel({
  kernel_id: 'k-between',
  state: 'hibernated',
  gpus: [],
  sleeps_after_cell: 2,
  actions: ['resume', 'shutdown']
});

describe('asleep between cells', () => {
  it('is a calm state on the card: it wakes when a cell runs', () => {
    const view = stateView(BETWEEN, NOW);
    assert.equal(view.kind, 'hibernated');
    assert.equal(view.label, 'asleep between cells: GPU slice given back, variables kept');
    assert.equal(view.detail, 'It wakes when a cell runs.');
    // a kernel without the rule: the usual words
    assert.match(stateView({ ...BETWEEN, sleeps_after_cell: null }, NOW).label, /^hibernated:/);
    // a cell waits on it: it is resuming for the cell, as any hibernated kernel
    assert.match(stateView(BETWEEN, NOW, true).label, /^resuming/);
  });

  it('says the same on the notebook toolbar, not "hibernated"', () => {
    const shown = indicatorView(me({ kernels: [BETWEEN] }), BETWEEN.kernel_id);
    assert.equal(shown.text, 'asleep between cells');
    assert.match(
      shown.title,
      /State: asleep between cells: GPU slice given back, variables kept\./
    );
    const idled = { ...BETWEEN, sleeps_after_cell: null };
    assert.equal(indicatorView(me({ kernels: [idled] }), idled.kernel_id).text, 'hibernated');
  });

  it('says on an idle card that it sleeps after each cell', () => {
    const idle = kernel({
      state: 'active',
      execution_state: 'idle',
      idle_since: NOW - 1,
      sleeps_after_cell: 2
    });
    assert.match(
      stateView(idle, NOW).detail,
      /^sleeps 2 s after each cell, wakes when a cell runs/
    );
    assert.doesNotMatch(stateView({ ...idle, sleeps_after_cell: null }, NOW).detail, /each cell/);
  });

  it('is never a notification, pushed or polled', () => {
    const pushedTo = new Screen();
    pushedTo.book.fromEvent(
      {
        action: 'hibernated',
        kernel_id: BETWEEN.kernel_id,
        user: 'alice',
        reason: 'after_cell',
        message: 'Asleep between cells: …'
      },
      NOW
    );
    assert.deepEqual(pushedTo.look().all, []);
    const polled = new Screen();
    polled.book.fromState(
      me({
        kernels: [BETWEEN],
        recent: [
          {
            at: NOW + 1,
            kind: 'hibernated',
            kernel_id: BETWEEN.kernel_id,
            reason: 'after_cell',
            message: 'Asleep between cells: …',
            rule: 'between-cells'
          }
        ]
      })
    );
    assert.deepEqual(polled.look().all, []);
    // an idle rule's hibernation of the same kernel is still on record (no toast: nothing is lost)
    const idle = new Screen();
    idle.book.fromEvent(
      {
        action: 'hibernated',
        kernel_id: BETWEEN.kernel_id,
        user: 'alice',
        reason: 'idle',
        message: 'Idle.'
      },
      NOW
    );
    assert.equal(idle.look().records.length, 1);
    assert.deepEqual(idle.look().toasts, []);
  });

  it('reads plainly in What happened', () => {
    const line = historyLine({
      at: NOW,
      kind: 'hibernated',
      kernel_id: BETWEEN.kernel_id,
      reason: 'after_cell',
      message: '',
      rule: 'between-cells'
    });
    assert.equal(
      line,
      'Asleep between cells: its GPU slice went back after its last cell; its variables are kept and its next cell wakes it. Rule: between-cells.'
    );
    assert.equal(reasonPhrase('after_cell'), 'no cell ran for a while after the last one');
  });
});
