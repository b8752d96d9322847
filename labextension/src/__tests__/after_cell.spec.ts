/**
 * A kernel whose rule says `hibernate_after_cell` holds its GPU only while cells run: it goes to
 * sleep unwarned a few seconds after each cell. The card says so calmly, no toast announces it, and
 * "What happened" says it plainly.
 */

import assert from 'node:assert/strict';

import { reasonPhrase } from '../format';
import { NoticeBook } from '../notices';
import { historyLine, stateView } from '../view';
import { kernel, me, NOW } from './fixtures';

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

  it('is never a toast, pushed or polled', () => {
    const book = new NoticeBook(NOW - 1);
    const pushed = book.fromEvent(
      {
        action: 'hibernated',
        kernel_id: BETWEEN.kernel_id,
        user: 'alice',
        reason: 'after_cell',
        message: 'Asleep between cells: …'
      },
      NOW
    );
    assert.deepEqual(pushed.show, []);
    const polled = new NoticeBook(NOW - 1).fromState(
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
    assert.deepEqual(polled.show, []);
    // an idle rule's hibernation of the same kernel is still explained
    const idle = new NoticeBook(NOW - 1).fromEvent(
      {
        action: 'hibernated',
        kernel_id: BETWEEN.kernel_id,
        user: 'alice',
        reason: 'idle',
        message: 'Idle.'
      },
      NOW
    );
    assert.equal(idle.show.length, 1);
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
