/**
 * The React components in jsdom: what is rendered for a state (roles, names, buttons), and
 * what the keyboard does. The view models they lay out are tested in view.spec.ts / admin.spec.ts.
 */

import assert from 'node:assert/strict';
import * as React from 'react';
import { act } from 'react';
import { createRoot, Root } from 'react-dom/client';

import { dashboardView } from '../admin';
import { IActions, KernelCard, Meter, MyKernels } from '../components';
import { DecisionLog, Tabs } from '../dashboard';
import { cardView } from '../view';
import { kernel, me, NOW, pool, warning } from './fixtures';

(globalThis as any).IS_REACT_ACT_ENVIRONMENT = true;

let host: HTMLDivElement;
let root: Root;

beforeEach(() => {
  host = document.createElement('div');
  document.body.appendChild(host);
  root = createRoot(host);
});

afterEach(() => {
  act(() => root.unmount());
  host.remove();
});

function render(element: JSX.Element): void {
  act(() => root.render(element));
}

const noActions: IActions = {
  run: async () => undefined,
  open: () => undefined,
  waiting: () => false
};

describe('Meter', () => {
  it('is a meter with a value where there is a reading against a limit', () => {
    render(
      <Meter
        view={{ label: 'Memory', text: '3 GiB of 10 GiB', fraction: 0.3, level: 'ok', note: '' }}
      />
    );
    const meter = host.querySelector('[role="meter"]')!;
    assert.equal(meter.getAttribute('aria-valuenow'), '30');
    assert.equal(meter.getAttribute('aria-valuetext'), '3 GiB of 10 GiB');
    assert.equal(meter.getAttribute('aria-label'), 'Memory: 3 GiB of 10 GiB');
  });

  it('is no meter (an image with a name) where there is no reading', () => {
    render(
      <Meter
        view={{
          label: 'Memory',
          text: '10 GiB slice',
          fraction: null,
          level: 'ok',
          note: 'no reading'
        }}
      />
    );
    assert.equal(host.querySelector('[role="meter"]'), null);
    assert.equal(
      host.querySelector('[role="img"]')!.getAttribute('aria-label'),
      'Memory: 10 GiB slice, no reading'
    );
  });
});

describe('KernelCard', () => {
  it('has Keep alive only while an action is pending, as a named button', () => {
    render(<KernelCard view={cardView(kernel(), NOW)} actions={noActions} />);
    const names = () =>
      [...host.querySelectorAll('button.jp-GpuPool-action')].map(b => b.getAttribute('aria-label'));
    assert.deepEqual(names(), ['Release GPU: Untitled.ipynb', 'Shut down: Untitled.ipynb']);
    render(<KernelCard view={cardView(kernel({ warning }), NOW)} actions={noActions} />);
    assert.deepEqual(names(), [
      'Keep alive: Untitled.ipynb',
      'Release GPU: Untitled.ipynb',
      'Shut down: Untitled.ipynb'
    ]);
    assert.match(
      host.querySelector('[role="timer"]')!.textContent!,
      /^shuts down in 2:00 \(at \d\d:\d\d\)$/
    );
  });

  it('passes the action and the button that asked, so that focus can go back to it', async () => {
    const calls: Array<[string, string, HTMLElement | null]> = [];
    const actions: IActions = {
      run: async (kernelId, action, opener) => {
        calls.push([kernelId, action.action, opener]);
      },
      open: () => undefined,
      waiting: () => false
    };
    render(<KernelCard view={cardView(kernel(), NOW)} actions={actions} />);
    const button = host.querySelector<HTMLButtonElement>('button.jp-mod-shutdown')!;
    await act(async () => button.click());
    assert.deepEqual(
      calls.map(c => c.slice(0, 2)),
      [[kernel().kernel_id, 'shutdown']]
    );
    assert.equal(calls[0][2], button);
    assert.equal(button.disabled, false); // never disabled: a disabled button would lose the focus
  });
});

describe('MyKernels', () => {
  it('puts a kernel with a pending action first and keeps the history short', () => {
    const recent = Array.from({ length: 6 }, (_, i) => ({
      at: NOW - 100 * (i + 1),
      kind: 'culled',
      kernel_id: `old-${i}`,
      name: `old-${i}.ipynb`,
      reason: 'idle',
      rule: 'demo',
      message: 'server text'
    }));
    render(
      <MyKernels
        me={me({
          kernels: [
            kernel({ kernel_id: 'a', name: 'a.ipynb' }),
            kernel({ kernel_id: 'b', name: 'b.ipynb', warning })
          ],
          recent
        })}
        now={NOW}
        actions={noActions}
      />
    );
    const cards = [...host.querySelectorAll('section.jp-GpuPool-card')].map(c =>
      c.getAttribute('data-kernel-id')
    );
    assert.deepEqual(cards, ['b', 'a']);
    const shown = host.querySelectorAll('.jp-GpuPool-history > ul > li');
    assert.equal(shown.length, 3);
    assert.match(
      shown[0].textContent!,
      /old-0\.ipynb Shut down because it was idle too long; its variables are gone\. Rule: demo\.$/
    );
    assert.equal(host.querySelector('details.jp-GpuPool-more summary')!.textContent, '3 earlier');
  });
});

describe('Tabs', () => {
  function TabsHarness(): JSX.Element {
    const [selected, setSelected] = React.useState('one');
    return (
      <Tabs
        label="Views"
        idPrefix="t"
        selected={selected}
        onSelect={setSelected}
        tabs={[
          { id: 'one', label: 'One' },
          { id: 'two', label: 'Two' },
          { id: 'three', label: 'Three' }
        ]}
      />
    );
  }

  it('moves the focus with the selection on arrow keys, Home and End', () => {
    render(<TabsHarness />);
    const tab = (id: string) => host.querySelector<HTMLButtonElement>(`#t-tab-${id}`)!;
    tab('one').focus();
    const press = (key: string) =>
      act(() => {
        document.activeElement!.dispatchEvent(new KeyboardEvent('keydown', { key, bubbles: true }));
      });
    press('ArrowRight');
    assert.equal(document.activeElement, tab('two'));
    assert.equal(tab('two').getAttribute('aria-selected'), 'true');
    assert.equal(tab('two').tabIndex, 0);
    assert.equal(tab('one').tabIndex, -1);
    press('End');
    assert.equal(document.activeElement, tab('three'));
    press('ArrowRight'); // wraps around
    assert.equal(document.activeElement, tab('one'));
    press('ArrowLeft');
    assert.equal(document.activeElement, tab('three'));
    press('Home');
    assert.equal(document.activeElement, tab('one'));
    assert.equal(tab('one').getAttribute('aria-selected'), 'true');
  });
});

describe('DecisionLog', () => {
  it('is a table filtered as the admin types', () => {
    render(<DecisionLog view={dashboardView(pool(), NOW)} />);
    const rows = () => [...host.querySelectorAll('table.jp-GpuPool-logTable tbody tr')];
    assert.equal(rows().length, 3);
    const headers = [...host.querySelectorAll('table.jp-GpuPool-logTable thead th')].map(
      th => th.textContent
    );
    assert.deepEqual(headers, ['Time', 'User', 'Notebook', 'Profile', 'What', 'Reason', 'Rule']);
    const input = host.querySelector<HTMLInputElement>('input[type="search"]')!;
    act(() => {
      const setter = Object.getOwnPropertyDescriptor(HTMLInputElement.prototype, 'value')!.set!;
      setter.call(input, 'hibernated');
      input.dispatchEvent(new Event('input', { bubbles: true }));
    });
    assert.equal(rows().length, 1);
    assert.match(
      rows()[0].textContent!,
      /^[\d:]+alicea\.ipynbgpu-20g-50hibernatedGPU memory held, GPU unuseddefault$/
    );
    assert.equal(host.querySelector('[role="status"]')!.textContent, '1 of 3 shown');
  });
});

describe('KernelCard after Release GPU', () => {
  it('keeps its buttons, inert and marked, while the server allows none, then shows the new ones', async () => {
    const actions: IActions = {
      run: async () => undefined,
      open: () => undefined,
      waiting: () => false
    };
    render(<KernelCard view={cardView(kernel(), NOW)} actions={actions} />);
    const release = host.querySelector<HTMLButtonElement>('button.jp-mod-release')!;
    await act(async () => release.click());
    // The server says hibernating: no actions allowed for a moment.
    render(
      <KernelCard
        view={cardView(kernel({ state: 'hibernating', actions: [] }), NOW)}
        actions={actions}
      />
    );
    const labels = () =>
      [...host.querySelectorAll('button.jp-GpuPool-action')].map(b => b.textContent);
    assert.deepEqual(labels(), ['Release GPU…', 'Shut down']);
    assert.ok(
      [...host.querySelectorAll('button.jp-GpuPool-action')].every(
        b => b.getAttribute('aria-disabled') === 'true'
      )
    );
    // Hibernated: the server's own actions again.
    render(
      <KernelCard
        view={cardView(kernel({ state: 'hibernated', actions: ['resume', 'shutdown'] }), NOW)}
        actions={actions}
      />
    );
    assert.deepEqual(labels(), ['Resume', 'Shut down']);
    assert.equal(host.querySelector('[aria-disabled="true"]'), null);
  });
});
