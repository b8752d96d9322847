/**
 * Every user-visible string goes through the translator, a whole sentence as one message (so that
 * a translation can reorder it), states, periods and unknown ids included. A "marking" translator
 * wraps each message it translates in ⟦ ⟧: a sentence glued together outside it shows as text
 * outside the brackets, or as two top-level messages.
 */

import assert from 'node:assert/strict';

import { ITranslator, nullTranslator, TranslationBundle } from '@jupyterlab/translation';

import { budgetUse, dashboardView } from '../admin';
import { kindWord, reasonPhrase, stateWord } from '../words';
import { DOMAIN, setTranslator } from '../i18n';
import { warningMessage } from '../notices';
import { historyLine, indicatorView, stateView, warningConsequence } from '../view';
import { kernel, me, NOW, pool, warning } from './fixtures';

const marking: ITranslator = {
  languageCode: 'xx',
  load: (domain: string) => {
    const base = nullTranslator.load(domain);
    return Object.assign(Object.create(base), {
      __: (msgid: string, ...args: Array<string | number>) => `⟦${base.__(msgid, ...args)}⟧`,
      _n: (one: string, many: string, n: number, ...args: Array<string | number>) =>
        `⟦${base._n(one, many, n, ...args)}⟧`
    }) as TranslationBundle;
  }
};

/** The top-level messages of a marked text, and whether any text lies outside them. */
function messages(text: string): { count: number; outside: string } {
  let depth = 0;
  let count = 0;
  let outside = '';
  for (const c of text) {
    if (c === '⟦') {
      count += depth === 0 ? 1 : 0;
      depth++;
    } else if (c === '⟧') {
      depth--;
    } else if (depth === 0) {
      outside += c;
    }
  }
  return { count, outside };
}

function oneMessage(text: string): void {
  assert.deepEqual(messages(text), { count: 1, outside: '' }, text);
}

describe('translation', () => {
  beforeAll(() => setTranslator(marking));
  afterAll(() => setTranslator(nullTranslator));

  it('loads the extension’s own domain', () => {
    assert.equal(DOMAIN, 'jupyter_gpu_pool');
  });

  it('writes each warning and its consequence as one sentence, whichever the action', () => {
    for (const action of ['shutdown', 'hibernate'] as const) {
      for (const snoozes_left of [0, 1]) {
        const k = kernel({ warning: { ...warning, action, snoozes_left } });
        oneMessage(warningMessage(k));
        oneMessage(warningConsequence(k));
      }
    }
  });

  it('writes a history line with its rule as one sentence', () => {
    oneMessage(
      historyLine({
        at: NOW,
        kernel_id: 'k',
        kind: 'culled',
        reason: 'idle',
        rule: 'demo',
        message: ''
      })
    );
    oneMessage(
      historyLine({ at: NOW, kernel_id: 'k', kind: 'new_kind', rule: 'demo', message: '' })
    );
  });

  it('translates states, kinds and reasons, unknown ones too', () => {
    for (const s of ['hibernating', 'hibernated', 'released', 'resuming', 'no_such_state']) {
      oneMessage(stateWord(s));
    }
    oneMessage(kindWord('no_such_kind'));
    oneMessage(reasonPhrase('no_such_reason'));
    oneMessage(stateView(kernel({ state: 'strange' as never }), NOW).label);
    oneMessage(
      indicatorView(me({ kernels: [kernel({ state: 'released' })] }), kernel().kernel_id).text
    );
  });

  it('shows a lease’s state and a budget’s period translated on the dashboard', () => {
    const [bobs] = pool().leases;
    const budget = {
      user: 'ann',
      scope: 'ann',
      kind: 'user',
      period: 'week',
      gpu_hours: 10,
      used_hours: 6.2,
      rate: 0,
      resets_at: NOW
    };
    const v = dashboardView(
      pool({ leases: [{ ...bobs, state: 'hibernated', phase: 'resuming' }], budgets: [budget] }),
      NOW
    );
    assert.equal(v.leases[0].state, '⟦resuming⟧');
    // The period is part of the message, not a word put into it.
    assert.equal(v.budgets[0].text, '⟦⟦6.2 h⟧ of ⟦10 h⟧ this week⟧');
    assert.equal(budgetUse({ ...budget, period: 'month' }), '⟦⟦6.2 h⟧ of ⟦10 h⟧ this month⟧');
    assert.equal(budgetUse({ ...budget, period: 'day' }), '⟦⟦6.2 h⟧ of ⟦10 h⟧ today⟧');
    for (const a of dashboardView(
      pool({ leases: [{ ...bobs, here: false, actions: ['release', 'hibernate', 'shutdown'] }] }),
      NOW
    ).leases[0].actions) {
      oneMessage(a.title);
    }
  });
});
