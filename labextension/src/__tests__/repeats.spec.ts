import assert from 'node:assert/strict';

import { TOAST_LIMIT } from '../notices';
import { counted, Repeats } from '../repeats';

describe('identical toasts merged', () => {
  it('counts a repeated text on the toast already there, and says how many times', () => {
    const repeats = new Repeats();
    const live = () => true;
    const text = '‘Python 3 · GPU 10 GiB’ could not start: no GPU has room for it.';
    assert.equal(repeats.find(text, live), null); // the first one needs a toast of its own
    assert.equal(repeats.add(text, 'refused:a:1', 'toast-1'), 1);
    assert.equal(repeats.find(text, live), 'toast-1');
    assert.equal(repeats.add(text, 'refused:b:2', 'toast-1'), 2);
    assert.equal(repeats.add(text, 'refused:c:3', 'toast-1'), 3);
    assert.equal(counted(text, 3), `${text} (3 times)`);
    assert.equal(counted(text, 1), text);
    // Another text is another toast.
    assert.equal(repeats.find('Something else.', live), null);
  });

  it('withdraws one notice at a time, and the toast only with the last', () => {
    const repeats = new Repeats();
    repeats.add('x', 'k1', 't');
    repeats.add('x', 'k2', 't');
    assert.deepEqual(repeats.remove('k1'), { id: 't', message: 'x', times: 1 });
    assert.deepEqual(repeats.remove('k2'), { id: 't', message: 'x', times: 0 });
    assert.equal(repeats.remove('k2'), null);
    assert.equal(
      repeats.find('x', () => true),
      null
    );
  });

  it('starts a new toast once the one counting the text is closed', () => {
    const repeats = new Repeats();
    repeats.add('x', 'k1', 't1');
    assert.equal(
      repeats.find('x', id => id !== 't1'),
      null
    );
    assert.equal(repeats.add('x', 'k2', 't2'), 1);
    assert.equal(repeats.remove('k1'), null); // forgotten with its closed toast
  });

  it('keeps the count within the toast limit, cutting the text, never the count', () => {
    const long = 'a'.repeat(TOAST_LIMIT);
    const text = counted(long, 12);
    assert.equal(text.length, TOAST_LIMIT);
    assert.ok(text.endsWith('… (12 times)'));
  });
});
