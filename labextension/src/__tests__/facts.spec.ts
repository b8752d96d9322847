/**
 * The toasts on screen are a function of the state: each stands for a fact that needs the user now
 * (a warning with a deadline, a refusal of their own action, a loss of state) and goes the moment
 * that fact stops holding, whatever order the polls and the pushed events arrive in; at most three
 * are on screen; everything else is a record in the notification centre. The sequences a user meets:
 * a wake after a hibernation, a new kernel after a shutdown, a resume after the queue, five refusals
 * in a row.
 */
import assert from 'node:assert/strict';

import { IFact, IHappening, MAX_ON_SCREEN, NoticeBook, placeToasts } from '../facts';
import type { IKernel, IKernelActionEvent, IMe, IRecent } from '../types';
import { kernel, me, NOW, profiles, Screen, warning } from './fixtures';

const K = 'k1';
const NAME = 'train.ipynb';

function k(overrides: Partial<IKernel> = {}): IKernel {
  return kernel({ kernel_id: K, name: NAME, ...overrides });
}

function entry(kind: string, at: number, fields: Partial<IRecent> = {}): IRecent {
  return { kind, at, kernel_id: K, name: NAME, reason: 'idle', message: '', ...fields };
}

function event(action: string, fields: Partial<IKernelActionEvent> = {}): IKernelActionEvent {
  return { action, kernel_id: K, user: 'alice', reason: 'idle', ...fields };
}

/** Every toast on screen holds: checked at each step of each sequence. */
function assertCalm(screen: Screen, stale: RegExp[] = []): string[] {
  const { toasts } = screen.look();
  assert.ok(toasts.length <= MAX_ON_SCREEN, `${toasts.length} toasts on screen`);
  const texts = toasts.map(t => t.message);
  for (const re of stale) {
    assert.ok(!texts.some(t => re.test(t)), `a stale toast: ${texts.join(' | ')}`);
  }
  return texts;
}

describe('a wake after a hibernation', () => {
  const hibernating = { ...warning, action: 'hibernate' as const, deadline: NOW + 60 };

  it('warns with a deadline, then tells the hibernation and the wake to the centre only', () => {
    const screen = new Screen();
    screen.book.fromState(me({ kernels: [k({ warning: hibernating })] }));
    assert.deepEqual(
      assertCalm(screen).map(t => t.replace(/\d\d:\d\d(:\d\d)?/, 'T')),
      [
        'train.ipynb’s kernel hibernates at T (idle too long): variables kept, slice given back. Run a cell or Keep alive to keep it.'
      ]
    );
    // The hibernation is pushed before the next poll: the warning goes at once (its GET me is older).
    screen.book.fromEvent(event('hibernated'), NOW + 60);
    assert.deepEqual(assertCalm(screen), []);
    const asleep = k({ state: 'hibernated', gpus: [], actions: ['resume', 'shutdown'] });
    screen.book.fromState(
      me({ now: NOW + 62, kernels: [asleep], recent: [entry('hibernated', NOW + 60)] })
    );
    assert.deepEqual(assertCalm(screen), []);
    // A cell wakes it: pushed, then polled; nothing pops up, nothing says "Run a cell to resume it".
    screen.book.fromEvent(event('resumed', { reason: 'cell' }), NOW + 100);
    const stale = [/Run a cell to resume/, /hibernat/];
    assertCalm(screen, stale);
    screen.book.fromState(
      me({
        now: NOW + 101,
        kernels: [k()],
        recent: [entry('hibernated', NOW + 60), entry('resumed', NOW + 100, { reason: 'cell' })]
      })
    );
    const { records } = screen.look();
    assert.deepEqual(assertCalm(screen, stale), []);
    assert.deepEqual(
      records.map(r => r.record!.replace(/\d\d:\d\d/, 'T')),
      [
        'At T, train.ipynb’s kernel hibernated (idle too long): its variables were kept.',
        'At T, train.ipynb’s kernel resumed: it took a GPU slice again.'
      ]
    );
  });

  it('ends the same whichever comes first, the poll or the event', () => {
    const orders = [
      ['event', 'poll'],
      ['poll', 'event']
    ];
    const ends = orders.map(order => {
      const screen = new Screen();
      screen.book.fromState(me({ kernels: [k({ warning: hibernating })] }));
      for (const step of order) {
        if (step === 'event') {
          screen.book.fromEvent(event('hibernated'), NOW + 60.4);
        } else {
          screen.book.fromState(
            me({
              now: NOW + 61,
              kernels: [k({ state: 'hibernated', gpus: [] })],
              recent: [entry('hibernated', NOW + 60)]
            })
          );
        }
        assertCalm(screen, [/hibernates at/]);
      }
      const { toasts, records } = screen.look();
      return { toasts: toasts.length, records: records.map(r => r.record) };
    });
    assert.deepEqual(ends[0], ends[1]);
    assert.equal(ends[0].records.length, 1);
  });
});

describe('a new kernel after a shutdown', () => {
  it('says the loss until a new kernel starts, then only the new kernel, never both', () => {
    const screen = new Screen();
    screen.book.fromState(me({ kernels: [k({ warning })] }));
    screen.book.fromEvent(event('culled'), NOW + 120);
    let { toasts } = screen.look();
    assert.equal(toasts.length, 1);
    assert.equal(toasts[0].nature, 'loss');
    assert.equal(toasts[0].newKernel, true);
    assert.equal(
      toasts[0].message,
      'train.ipynb’s kernel was shut down (idle too long): its variables are gone. Start a new kernel and run your cells again.'
    );
    // The poll reports the same cull: still one toast.
    screen.book.fromState(
      me({ now: NOW + 121, kernels: [], recent: [entry('culled', NOW + 120)] })
    );
    assert.equal(screen.look().toasts.length, 1);
    // The user starts a new kernel in the notebook: the loss is told, Run all cells is offered.
    screen.book.add('new_kernel', { kernelId: 'k2', replaces: K, name: NAME, at: NOW + 130 });
    const after = screen.look();
    assert.deepEqual(
      after.toasts.map(t => t.message),
      [
        'A new kernel started for train.ipynb: the variables from before the shutdown are gone. Run your cells again from the top.'
      ]
    );
    assert.equal(after.toasts[0].runAll, true);
    assert.ok(
      after.records.some(r =>
        /^At \d\d:\d\d, train\.ipynb’s kernel was shut down \(idle too long\): its variables are gone\.$/.test(
          r.record!
        )
      ),
      'the loss stays on record'
    );
    // A cell runs on the new kernel: nothing left to say.
    screen.ran.add('k2');
    ({ toasts } = screen.look());
    assert.deepEqual(toasts, []);
  });

  it('withdraws the loss when the notebook has another kernel by other means', () => {
    const screen = new Screen();
    screen.book.fromEvent(event('culled'), NOW + 1);
    assert.equal(screen.look().toasts.length, 1);
    screen.replaced.add(K); // the user picked a kernel from the notebook's toolbar
    assert.deepEqual(screen.look().toasts, []);
    // or its notebook runs another GPU kernel now (GET me says so)
    const other = new Screen();
    other.book.fromState(me({ kernels: [k()] }));
    other.book.fromEvent(event('culled'), NOW + 1);
    assert.equal(other.look().toasts.length, 1);
    other.book.fromState(me({ now: NOW + 5, kernels: [kernel({ kernel_id: 'k9', name: NAME })] }));
    assert.deepEqual(other.look().toasts, []);
  });
});

describe('a resume after the queue', () => {
  it('never pops up while it waits, and nothing says it waits once it resumed', () => {
    const screen = new Screen();
    const asleep = k({ state: 'hibernated', gpus: [] });
    screen.book.fromState(me({ kernels: [asleep] }));
    screen.book.fromEvent(event('queued', { reason: 'pool_exhausted' }), NOW + 5);
    assert.deepEqual(assertCalm(screen), []);
    screen.book.fromState(
      me({
        now: NOW + 6,
        kernels: [{ ...asleep, state: 'queued', queue_position: 1 }],
        recent: [entry('queued', NOW + 5, { reason: 'pool_exhausted' })]
      })
    );
    assert.deepEqual(assertCalm(screen), []);
    screen.book.fromEvent(event('resumed', { reason: 'cell' }), NOW + 50);
    screen.book.fromState(
      me({
        now: NOW + 51,
        kernels: [k()],
        recent: [
          entry('queued', NOW + 5, { reason: 'pool_exhausted' }),
          entry('resumed', NOW + 50, { reason: 'cell' })
        ]
      })
    );
    const { toasts, records } = screen.look();
    assert.deepEqual(toasts, []);
    assert.ok(!records.some(r => /waits|wait for/.test(r.record!)), 'no "waits" left anywhere');
    assert.equal(records.length, 2);
  });

  it('shows a refused resume while the kernel is still asleep, and withdraws it once it resumed', () => {
    const screen = new Screen();
    const asleep = k({ state: 'hibernated', gpus: [] });
    const refused = entry('refused', NOW + 30, { reason: 'queue_timeout', action: 'resume' });
    screen.book.fromState(me({ now: NOW + 31, kernels: [asleep], recent: [refused] }));
    assert.deepEqual(screen.toasts(), [
      'train.ipynb’s kernel could not resume: no slice freed up in time. Its variables are kept.'
    ]);
    screen.book.fromState(me({ now: NOW + 90, kernels: [k()], recent: [refused] }));
    assert.deepEqual(screen.toasts(), []);
    assert.match(
      screen.look().records[0].record!,
      /^At \d\d:\d\d, train\.ipynb’s kernel could not resume \(no slice freed up in time\); its variables were kept\.$/
    );
  });
});

describe('five refusals in a row', () => {
  const refusal = (i: number, profile: string, kernelId = `new-${i}`): IRecent => ({
    kind: 'refused',
    at: NOW + 10 + i,
    kernel_id: kernelId,
    reason: 'quota_exceeded',
    profile,
    message: 'Your quota…'
  });
  const full = {
    quota: { memory: null, sm_percent: null, kernels: 1 },
    usage: { memory: 10 * 2 ** 30, sm_percent: 0, kernels: 1 }
  };

  it('of one profile: one toast, counted', () => {
    const screen = new Screen();
    const recent: IRecent[] = [];
    for (let i = 0; i < 5; i++) {
      screen.book.fromEvent(
        { action: 'refused', kernel_id: `new-${i}`, reason: 'quota_exceeded', profile: 'gpu-10g' },
        NOW + 10 + i
      );
      recent.push(refusal(i, 'gpu-10g'));
      screen.book.fromState(
        me({
          ...full,
          now: NOW + 10.5 + i,
          kernels: [],
          recent: [...recent],
          profiles: profiles({})
        })
      );
      assert.equal(screen.look().toasts.length, 1);
    }
    assert.deepEqual(screen.toasts(), [
      '‘Python 3 · GPU 10 GiB’ could not start: your GPU quota is used up. You hold 1 of 1 GPU kernels: shut one down first. (5 times)'
    ]);
  });

  it('of five profiles: three toasts, the rest in the centre; a new warning takes the oldest one’s place', () => {
    const screen = new Screen();
    const names = ['gpu-10g', 'gpu-20g', 'gpu-whole', 'gpu-5g', 'gpu-15g'];
    const recent: IRecent[] = [];
    names.forEach((profile, i) => {
      recent.push(refusal(i, profile));
      screen.book.fromState(me({ ...full, now: NOW + 10.5 + i, kernels: [], recent: [...recent] }));
      assertCalm(screen);
    });
    const seen = screen.look();
    assert.equal(seen.toasts.length, 3);
    assert.equal(seen.centre.length, 2);
    assert.deepEqual(
      seen.toasts.map(t => t.key),
      recent.slice(0, 3).map(r => `refused:${r.kernel_id}:${Math.round(r.at)}`)
    );
    // A warning arrives: it takes the place of the oldest refusal, which goes to the centre for good.
    const warned = k({ warning: { ...warning, deadline: NOW + 400 } });
    screen.book.fromState(me({ ...full, now: NOW + 20, kernels: [warned], recent: [...recent] }));
    const now = screen.look();
    assert.equal(now.toasts.length, 3);
    assert.equal(now.toasts[2].nature, 'warning');
    assert.ok(now.centre.some(f => f.key === seen.toasts[0].key));
    // The warning is snoozed away: its place stays free; the refusal sent to the centre stays there.
    screen.book.fromState(me({ ...full, now: NOW + 30, kernels: [k()], recent: [...recent] }));
    assert.equal(screen.look().toasts.length, 2);
  });

  it('never shows one the user closed again, and a new one after it is a toast of its own', () => {
    const screen = new Screen();
    const recent = [refusal(0, 'gpu-10g')];
    screen.book.fromState(me({ ...full, now: NOW + 11, kernels: [], recent }));
    const [first] = screen.look().toasts;
    screen.close(first);
    for (const t of [NOW + 12, NOW + 20, NOW + 60]) {
      screen.book.fromState(me({ ...full, now: t, kernels: [], recent }));
      assert.deepEqual(screen.toasts(), []);
    }
    recent.push(refusal(1, 'gpu-10g'));
    screen.book.fromState(me({ ...full, now: NOW + 70, kernels: [], recent }));
    assert.equal(screen.toasts().length, 1);
    assert.doesNotMatch(screen.toasts()[0], /times/);
  });
});

describe('placeToasts', () => {
  const fact = (key: string, nature: IFact['nature'], at: number): IFact => ({
    key,
    members: [key],
    kernelId: '',
    nature,
    type: 'info',
    message: key,
    record: null,
    at,
    keepAlive: false,
    release: false,
    newKernel: false,
    openPanel: false,
    runAll: false
  });

  it('keeps those on screen, fills free places, sends the rest to the centre', () => {
    const facts = [fact('a', 'refusal', 1), fact('b', 'loss', 2), fact('c', 'refusal', 3)];
    assert.deepEqual(placeToasts(facts, [], new Set()), { onScreen: ['a', 'b', 'c'], demoted: [] });
    const more = [...facts, fact('d', 'refusal', 4)];
    assert.deepEqual(placeToasts(more, ['a', 'b', 'c'], new Set()), {
      onScreen: ['a', 'b', 'c'],
      demoted: ['d']
    });
    // Warnings: a new one takes the oldest other's place; among warnings only, the oldest warning's.
    const warned = [...facts, fact('w', 'warning', 5)];
    assert.deepEqual(placeToasts(warned, ['a', 'b', 'c'], new Set()), {
      onScreen: ['b', 'c', 'w'],
      demoted: ['a']
    });
    const warnings = ['w1', 'w2', 'w3', 'w4'].map((key, i) => fact(key, 'warning', i));
    assert.deepEqual(placeToasts(warnings, ['w1', 'w2', 'w3'], new Set()).demoted, ['w1']);
    // A place freed: a fact sent to the centre does not come back, a new one takes it.
    assert.deepEqual(
      placeToasts([fact('b', 'loss', 2), fact('d', 'refusal', 4)], ['b'], new Set(['d'])),
      {
        onScreen: ['b'],
        demoted: []
      }
    );
  });
});

describe('the book of happenings', () => {
  it('keeps a pushed event and its polled entry as one happening, in the entry’s words', () => {
    const book = new NoticeBook(NOW - 1);
    book.fromEvent(event('refused', { reason: 'pool_exhausted' }), NOW + 2.6);
    book.fromState(
      me({
        now: NOW + 3,
        kernels: [k({ state: 'hibernated', gpus: [] })],
        recent: [entry('refused', NOW + 2, { reason: 'pool_exhausted', action: 'resume' })]
      })
    );
    const [h] = book.happenings as IHappening[];
    assert.equal(book.happenings.length, 1);
    assert.equal(h.action, 'resume'); // a refused resume, not a refused start
    assert.equal(h.at, NOW + 2);
    const facts = new Screen(book).look().all;
    assert.match(facts[0].message, /could not resume: no GPU has room for it/);
  });

  it('tells two resumes of one kernel minutes apart apart, each once in every later poll', () => {
    const screen = new Screen();
    const resumed = (at: number) => entry('resumed', at, { reason: 'cell' });
    screen.book.fromEvent(event('resumed', { reason: 'cell' }), NOW + 10);
    screen.book.fromState(me({ now: NOW + 12, kernels: [k()], recent: [resumed(NOW + 9)] }));
    for (const t of [NOW + 401, NOW + 900]) {
      screen.book.fromState(
        me({ now: t, kernels: [k()], recent: [resumed(NOW + 9), resumed(NOW + 400)] })
      );
      assert.equal(screen.book.happenings.length, 2);
    }
  });

  it('ignores dry runs, the user’s own releases, wakes on a hint and sleeps between cells', () => {
    const book = new NoticeBook(NOW - 1);
    book.fromEvent(event('culled', { dry_run: true }), NOW);
    book.fromEvent(event('released', { reason: 'user' }), NOW);
    book.fromEvent(event('resumed', { reason: 'hint' }), NOW);
    book.fromEvent(event('hibernated', { reason: 'after_cell' }), NOW);
    book.fromEvent(event('warned'), NOW);
    assert.deepEqual(book.happenings, []);
    // A wake the ledger put on record without its reason, of a kernel woken on a hint: no news either.
    const woken = new Screen();
    woken.book.fromState(
      me({
        kernels: [k({ woken_on_hint: true, state: 'resuming' })],
        recent: [entry('resumed', NOW, { reason: '' })]
      })
    );
    assert.deepEqual(woken.look().all, []);
  });

  it('reads a refused start’s advice from the GET me after it, and withdraws it once it is false', () => {
    const screen = new Screen();
    screen.book.fromState(me({ profiles: profiles({ 'gpu-20g': true, 'gpu-10g': true }) }));
    screen.book.fromEvent(
      { action: 'refused', kernel_id: 'k9', reason: 'pool_exhausted', profile: 'gpu-20g' },
      NOW + 2
    );
    assert.deepEqual(screen.look().all, []); // its advice would be stale: it waits for GET me
    const refused: IRecent = {
      kind: 'refused',
      kernel_id: 'k9',
      reason: 'pool_exhausted',
      profile: 'gpu-20g',
      message: '…',
      at: NOW + 2
    };
    const withRoom = (now: number, room: boolean): IMe =>
      me({ now, profiles: profiles(room ? { 'gpu-10g': true } : {}), recent: [refused] });
    screen.book.fromState(withRoom(NOW + 3, true));
    assert.deepEqual(screen.toasts(), [
      '‘Python 3 · GPU 20 GiB’ could not start: no GPU has room for it. ‘Python 3 · GPU 10 GiB’ would start now.'
    ]);
    screen.book.fromState(withRoom(NOW + 8, true));
    assert.equal(screen.toasts().length, 1);
    screen.book.fromState(withRoom(NOW + 20, false)); // the pool filled up: the advice is false now
    assert.deepEqual(screen.toasts(), []);
    screen.book.fromState(withRoom(NOW + 30, true)); // and true again: it stays a record
    const later = screen.look();
    assert.deepEqual(later.toasts, []);
    assert.equal(later.records.length, 1);
  });
});
