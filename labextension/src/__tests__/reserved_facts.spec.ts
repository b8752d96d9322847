/**
 * A kernel on borrowed room, warned when a reservation's member needs the room: a warning with a
 * deadline, so a toast, in the catalogue's words ("reserved for Research block until 16:00, and a member
 * needs it"), with Release now and never Keep alive (a snooze cannot keep reserved room); withdrawn the
 * moment the server withdraws it (the member's need gone), leaving nothing behind; and a hibernation at
 * its deadline told calmly, in the notification centre only, whichever of the poll and the event
 * arrives first.
 */
import assert from 'node:assert/strict';

import type { IKernel, IKernelActionEvent, IReservation } from '../types';
import { GiB, kernel, me, NOW, Screen, warning } from './fixtures';

const K = 'k-borrow';
const NAME = 'train.ipynb';
const TEN = NOW - 400; // 10:00 UTC; NOW is 10:06:40

const research: IReservation = {
  name: 'Research block',
  phase: 'open',
  start: TEN,
  end: TEN + 6 * 3600,
  member: false,
  memory: 40 * GiB,
  gpus: null,
  models: [],
  lead: 300,
  borrowing: true
};

const BORROWED =
  'Borrowed from the room reserved for Research block until 16:00: it may be hibernated (its variables kept), with a warning, when a member needs the room.';

const reclaim = {
  ...warning,
  action: 'hibernate' as const,
  reason: 'reserved',
  deadline: NOW + 60,
  snoozes_left: 2, // the server counts them; a snooze of reserved room is refused all the same
  message:
    'The GPU room this kernel holds is reserved for Research block until 16:00, and a member needs it: this kernel will be hibernated (its variables are kept; the GPU slice is given back) in 1m (no snooze: the room is reserved).'
};

function borrowing(overrides: Partial<IKernel> = {}): IKernel {
  return kernel({
    kernel_id: K,
    name: NAME,
    borrowed: BORROWED,
    actions: ['snooze', 'release', 'shutdown'],
    ...overrides
  });
}

function event(action: string, fields: Partial<IKernelActionEvent> = {}): IKernelActionEvent {
  return { action, kernel_id: K, user: 'alice', reason: 'reserved', ...fields };
}

describe('a borrowed kernel’s reclaim warning', () => {
  it('is a toast in the catalogue’s words, with Release now and no Keep alive', () => {
    const screen = new Screen();
    screen.book.fromState(
      me({ reservations: [research], kernels: [borrowing({ warning: reclaim })] })
    );
    const { toasts, records } = screen.look();
    assert.equal(toasts.length, 1);
    const [toast] = toasts;
    assert.equal(toast.nature, 'warning');
    assert.equal(
      toast.message,
      'train.ipynb’s kernel hibernates at 10:07:40, variables kept: its room is reserved for Research block until 16:00, and a member needs it.'
    );
    assert.ok(toast.message.length <= 140);
    assert.equal(toast.keepAlive, false);
    assert.equal(toast.release, true);
    assert.equal(toast.openPanel, true);
    assert.deepEqual(records, []);
  });

  it('says the reservation’s start before its window, and the kernel’s name in full where it fits', () => {
    const screen = new Screen();
    const soon = { ...research, phase: 'making_room', start: NOW + 600, end: NOW + 4200 };
    screen.book.fromState(
      me({
        reservations: [soon],
        kernels: [
          kernel({
            kernel_id: K,
            name: 'a.ipynb',
            warning: {
              ...reclaim,
              message: 'The GPU room this kernel holds is reserved for Research block from 10:16: …'
            }
          })
        ]
      })
    );
    assert.deepEqual(screen.toasts(), [
      'a.ipynb’s kernel hibernates at 10:07:40: its GPU room is reserved for Research block from 10:16. Its variables are kept.'
    ]);
  });

  it('is withdrawn the moment the server withdraws it, and leaves nothing behind', () => {
    const screen = new Screen();
    screen.book.fromState(
      me({ reservations: [research], kernels: [borrowing({ warning: reclaim })] })
    );
    assert.equal(screen.look().toasts.length, 1);
    // The member's start found room elsewhere (or they left the queue): the culler withdraws it.
    screen.book.fromState(me({ now: NOW + 5, reservations: [research], kernels: [borrowing()] }));
    const { toasts, centre, records } = screen.look();
    assert.deepEqual([toasts, centre, records], [[], [], []]);
    // a member asks again later: a new warning, a new toast
    const again = { ...reclaim, deadline: NOW + 120 };
    screen.book.fromState(
      me({ now: NOW + 60, reservations: [research], kernels: [borrowing({ warning: again })] })
    );
    assert.match(screen.toasts().join(), /hibernates at 10:08:40, variables kept/);
  });

  it('ends in a calm record of the hibernation, whichever arrives first, the poll or the event', () => {
    const ends = ['event first', 'poll first'].map(order => {
      const screen = new Screen();
      screen.book.fromState(
        me({ reservations: [research], kernels: [borrowing({ warning: reclaim })] })
      );
      const asleep = borrowing({ state: 'hibernated', gpus: [], borrowed: null, warning: null });
      const poll = () =>
        screen.book.fromState(
          me({
            now: NOW + 61,
            reservations: [research],
            kernels: [asleep],
            recent: [
              {
                at: NOW + 60,
                kind: 'hibernated',
                kernel_id: K,
                name: NAME,
                reason: 'reserved',
                action: 'hibernate',
                message: 'Hibernated for a reservation: …'
              }
            ]
          })
        );
      const push = () => screen.book.fromEvent(event('hibernated'), NOW + 60.3);
      for (const step of order === 'event first' ? [push, poll] : [poll, push]) {
        step();
        assert.deepEqual(screen.toasts(), [], order); // the warning goes at once; no toast for the sleep
      }
      return screen.look().records.map(r => r.record);
    });
    assert.deepEqual(ends[0], ends[1]);
    assert.deepEqual(ends[0], [
      'At 10:07, train.ipynb’s kernel hibernated (its GPU room is reserved for others): its variables were kept.'
    ]);
  });
});
