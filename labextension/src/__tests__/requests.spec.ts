/**
 * An admin's Release, Hibernate or Shut down of a kernel stays visible until it is carried out or
 * refused: another user's server acts at its next pass, and the admin saw a note, then nothing.
 */
import assert from 'node:assert/strict';

import type { INotes } from '../actions';
import { AdminRequests, IAdminRequest, outcome } from '../requests';
import type { IPool } from '../types';
import { NOW, pool } from './fixtures';

const REQUEST: IAdminRequest = {
  kernelId: 'k-bob-1',
  who: 'bob’s b.ipynb',
  action: 'hibernate',
  at: NOW,
  state: 'active',
  phase: '',
  elsewhere: true
};

function withLease(state: string, phase = '', decisions: IPool['decisions'] = []): IPool {
  const base = pool();
  return pool({
    leases: base.leases.map(l => (l.kernel_id === 'k-bob-1' ? { ...l, state, phase } : l)),
    decisions
  });
}

class Notes implements INotes {
  failures: string[] = [];
  note(): void {
    // what was done: not asserted here
  }
  failed(_: string, message: string): void {
    this.failures.push(message);
  }
}

describe('an admin’s request', () => {
  it('is pending until the lease moves, and carried out when it does or is gone', () => {
    assert.deepEqual(outcome(REQUEST, withLease('active')), { kind: 'pending' });
    assert.deepEqual(outcome(REQUEST, withLease('active', 'hibernating')), { kind: 'done' });
    assert.deepEqual(outcome(REQUEST, withLease('hibernated')), { kind: 'done' });
    assert.deepEqual(outcome(REQUEST, pool({ leases: [] })), { kind: 'done' });
  });

  it('is refused when the kernel’s server puts a refusal on record after it, not before', () => {
    const refusal = (at: number) => ({
      at,
      kind: 'refused',
      kernel_id: 'k-bob-1',
      owner: 'bob',
      reason: 'admin',
      action: 'hibernate',
      message: 'Not hibernated: it cannot hibernate: an MPS kernel.'
    });
    assert.deepEqual(outcome(REQUEST, withLease('active', '', [refusal(NOW - 60)])), {
      kind: 'pending'
    });
    assert.deepEqual(outcome(REQUEST, withLease('active', '', [refusal(NOW + 3)])), {
      kind: 'refused',
      message: 'Not hibernated: it cannot hibernate: an MPS kernel.'
    });
  });

  it('says on its row where it stands, tells a refusal once, and goes once carried out', () => {
    const notes = new Notes();
    const requests = new AdminRequests(notes);
    requests.add(REQUEST);
    requests.follow(withLease('active'));
    const pending = requests.view('k-bob-1')!;
    assert.equal(pending.pending, true);
    assert.match(
      pending.text,
      /^Hibernate asked at \d\d:\d\d:\d\d: waiting for its own server, which acts at its next pass…$/
    );
    const refused = withLease('active', '', [
      {
        at: NOW + 2,
        kind: 'refused',
        kernel_id: 'k-bob-1',
        reason: 'admin',
        message: 'Not hibernated: it is busy.'
      }
    ]);
    requests.follow(refused);
    requests.follow(refused);
    assert.equal(notes.failures.length, 1);
    assert.match(
      requests.view('k-bob-1')!.text,
      /^Hibernate asked at \d\d:\d\d:\d\d, not carried out: Not hibernated: it is busy\.$/
    );
    assert.equal(requests.view('k-bob-1')!.pending, false);
    requests.follow(withLease('hibernated'));
    assert.equal(requests.view('k-bob-1'), null);
    // Carried out by the kernel's own server: the row shows its new state, nothing more.
    requests.add({ ...REQUEST, elsewhere: false });
    assert.match(requests.view('k-bob-1')!.text, /under way…$/);
    requests.follow(withLease('active', 'hibernating'));
    assert.equal(requests.view('k-bob-1'), null);
  });
});
