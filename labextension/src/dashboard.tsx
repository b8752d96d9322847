/**
 * The admins' dashboard in the main area: every GPU with its kernels' memory and
 * utilization over time (stacked, so each kernel's share shows), the leases with
 * Release / Hibernate / Shut down, the queue, everyone's GPU time, and the
 * policy's decision log as a filterable table.
 */

import * as React from 'react';

import {
  dashboardView,
  filterDecisions,
  gpuPlots,
  IDashboardView,
  IDecisionFilter,
  IDecisionRow,
  ILeaseRow
} from './admin';
import { StackedChart } from './chart';
import { MeterTrack } from './components';
import { plainNote } from './format';
import { IReservationBand, reservationBands } from './reservations';
import { __ } from './i18n';
import type { AdminAction, IPool, IProfile, ITelemetry } from './types';
import { kindWord } from './words';

export interface IAdminActions {
  /** Ask, carry out and report an admin's action; `opener` gets focus back after the dialog. */
  act(row: ILeaseRow, action: AdminAction, opener: HTMLElement | null): Promise<void>;
  open(path: string): void;
  /** What was asked of a lease and not carried out yet (or refused), or null (requests.ts). */
  request(kernelId: string): { text: string; pending: boolean } | null;
}

type TabId = 'gpus' | 'decisions' | 'budgets';

/**
 * A tab list that follows the ARIA tabs pattern: one tab in the tab order, arrow keys (and Home,
 * End) move the focus and the selection together.
 */
export function Tabs(props: {
  label: string;
  tabs: Array<{ id: string; label: string }>;
  selected: string;
  onSelect: (id: string) => void;
  idPrefix: string;
}): JSX.Element {
  const refs = React.useRef(new Map<string, HTMLButtonElement>());
  const move = (event: React.KeyboardEvent) => {
    const ids = props.tabs.map(t => t.id);
    const at = ids.indexOf(props.selected);
    let next: number;
    switch (event.key) {
      case 'ArrowRight':
        next = (at + 1) % ids.length;
        break;
      case 'ArrowLeft':
        next = (at - 1 + ids.length) % ids.length;
        break;
      case 'Home':
        next = 0;
        break;
      case 'End':
        next = ids.length - 1;
        break;
      default:
        return;
    }
    event.preventDefault();
    props.onSelect(ids[next]);
    refs.current.get(ids[next])?.focus();
  };
  return (
    <div className="jp-GpuPool-tabs" role="tablist" aria-label={props.label} onKeyDown={move}>
      {props.tabs.map(t => (
        <button
          key={t.id}
          ref={node => {
            if (node) {
              refs.current.set(t.id, node);
            } else {
              refs.current.delete(t.id);
            }
          }}
          role="tab"
          id={`${props.idPrefix}-tab-${t.id}`}
          aria-selected={props.selected === t.id}
          aria-controls={`${props.idPrefix}-panel-${t.id}`}
          tabIndex={props.selected === t.id ? 0 : -1}
          className={`jp-GpuPool-tab${props.selected === t.id ? ' jp-mod-active' : ''}`}
          onClick={() => props.onSelect(t.id)}
        >
          {t.label}
        </button>
      ))}
    </div>
  );
}

function Bar(props: { fraction: number; label: string; level?: string }): JSX.Element {
  const level = props.level ?? (props.fraction >= 0.9 ? 'near' : 'ok');
  return (
    <MeterTrack fraction={props.fraction} level={level} label={props.label} text={props.label} />
  );
}

function GpuSection(props: {
  view: IDashboardView;
  telemetry: ITelemetry | null;
  telemetryError: string | null;
  bands: Map<string, IReservationBand[]>;
}): JSX.Element {
  const { view } = props;
  const plots = props.telemetry ? gpuPlots(props.telemetry) : [];
  return (
    <section aria-labelledby="jp-GpuPool-dash-gpus">
      <h2 id="jp-GpuPool-dash-gpus" className="jp-GpuPool-sectionTitle">
        {__('GPUs')}
      </h2>
      <GpuTable view={view} />
      {props.telemetryError ? (
        <p className="jp-GpuPool-empty">{__('No readings: %1', plainNote(props.telemetryError))}</p>
      ) : null}
      <div className="jp-GpuPool-plots">
        {plots.map(p => (
          <div key={p.uuid} className="jp-GpuPool-gpuPlots" data-gpu={p.uuid}>
            <h3 className="jp-GpuPool-plotTitle">
              {p.name}
              {p.slicesOnly ? (
                <span
                  className="jp-GpuPool-badge"
                  title={__(
                    'No readings on this GPU: the memory plot shows what each kernel’s slice holds.'
                  )}
                >
                  {__('no readings: slices shown')}
                </span>
              ) : null}
            </h3>
            <StackedChart
              title={__('%1 memory by kernel (GiB)', p.name)}
              data={p.memory}
              bands={props.bands.get(p.uuid)}
            />
            <StackedChart title={__('%1 utilization by kernel (%)', p.name)} data={p.utilization} />
          </div>
        ))}
      </div>
    </section>
  );
}

/** Each GPU: the memory its slices hold, their number, its utilization. */
function GpuTable(props: { view: IDashboardView }): JSX.Element {
  return (
    <table className="jp-GpuPool-table jp-GpuPool-gpuTable">
      <thead>
        <tr>
          <th scope="col">{__('GPU')}</th>
          <th scope="col">{__('Memory held by slices')}</th>
          <th scope="col">{__('Slices')}</th>
          <th scope="col">{__('Utilization')}</th>
        </tr>
      </thead>
      <tbody>
        {props.view.gpus.map(g => (
          <tr key={g.uuid} data-gpu={g.uuid}>
            <th scope="row" title={g.label}>
              {g.name}
              <span className="jp-GpuPool-muted jp-GpuPool-gpuModel">
                {g.label.split(' · ').slice(1).join(' · ')}
              </span>
            </th>
            <td>
              <span className="jp-GpuPool-cellText">{g.memoryText}</span>
              <Bar fraction={g.fraction} label={`${g.name}: ${g.memoryText}`} />
            </td>
            <td>{g.slices}</td>
            <td>{g.utilization}</td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}

/** The admin's reservations: for whom, when, how much, and where each stands now. */
function ReservationTable(props: { view: IDashboardView }): JSX.Element | null {
  const rows = props.view.reservations;
  if (!rows.length) {
    return null;
  }
  return (
    <section aria-labelledby="jp-GpuPool-dash-reservations">
      <h2 id="jp-GpuPool-dash-reservations" className="jp-GpuPool-sectionTitle">
        {__('Reservations (%1)', rows.length)}
      </h2>
      <table className="jp-GpuPool-table jp-GpuPool-reservationTable">
        <thead>
          <tr>
            <th scope="col">{__('Reservation')}</th>
            <th scope="col">{__('For')}</th>
            <th scope="col">{__('Window')}</th>
            <th scope="col">{__('Room')}</th>
            <th scope="col">{__('Phase')}</th>
            <th scope="col">{__('Now')}</th>
          </tr>
        </thead>
        <tbody>
          {rows.map(r => (
            <tr key={r.key} data-reservation={r.name}>
              <th scope="row">{r.name}</th>
              <td>{r.who}</td>
              <td>{r.window}</td>
              <td>{r.room}</td>
              <td>{r.phase}</td>
              <td>{r.now}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </section>
  );
}

/**
 * A lease's row: the profile over at most two lines with its slice under it, the state with what an
 * admin asked of it until it is carried out or refused (its buttons inert meanwhile), the actions
 * side by side (they wrap, never cut, in a narrow main area).
 */
function LeaseRow(props: {
  row: ILeaseRow;
  busy: string | null;
  act: (row: ILeaseRow, action: AdminAction, opener: HTMLElement) => Promise<void>;
  actions: IAdminActions;
}): JSX.Element {
  const l = props.row;
  const asked = props.actions.request(l.kernelId);
  return (
    <tr data-kernel-id={l.kernelId}>
      <td>{l.owner}</td>
      <td className="jp-GpuPool-nameCell" title={l.path}>
        {l.notebook}
      </td>
      <td className="jp-GpuPool-profileCell" title={l.profileId}>
        {l.profile} <span className="jp-GpuPool-muted jp-GpuPool-sliceText">({l.slice})</span>
      </td>
      <td>{l.gpu}</td>
      <td className="jp-GpuPool-stateCell">
        {l.state}
        {l.borrowed ? <span className="jp-GpuPool-borrowedMark">{l.borrowed}</span> : null}
        {asked ? (
          <span
            className={`jp-GpuPool-asked${asked.pending ? ' jp-mod-pending' : ' jp-mod-refused'}`}
            role="status"
          >
            {asked.text}
          </span>
        ) : null}
      </td>
      <td>{l.age}</td>
      <td>{l.idle}</td>
      <td>
        <div className="jp-GpuPool-rowActions">
          {l.actions.map(a => (
            <button
              key={a.action}
              className={`jp-Button jp-GpuPool-action jp-mod-${a.action}`}
              title={a.title}
              aria-label={__('%1: %2 of %3', a.label, l.notebook, l.owner)}
              aria-busy={props.busy === `${l.kernelId}:${a.action}`}
              aria-disabled={asked?.pending || undefined}
              onClick={event => {
                if (props.busy === null && !asked?.pending) {
                  void props.act(l, a.action, event.currentTarget);
                }
              }}
            >
              {a.label}
            </button>
          ))}
        </div>
      </td>
    </tr>
  );
}

/** Who waits for a slice, first first. */
function QueueTable(props: { view: IDashboardView }): JSX.Element {
  const why = props.view.queue.some(q => q.why);
  return (
    <>
      <h2 className="jp-GpuPool-sectionTitle">{__('Queue (%1)', props.view.queue.length)}</h2>
      {props.view.queue.length === 0 ? (
        <p className="jp-GpuPool-empty">{__('Nobody waits for a slice.')}</p>
      ) : (
        <table className="jp-GpuPool-table jp-GpuPool-queueTable">
          <thead>
            <tr>
              <th scope="col">#</th>
              <th scope="col">{__('User')}</th>
              <th scope="col">{__('Notebook')}</th>
              <th scope="col">{__('For')}</th>
              <th scope="col">{__('Profile')}</th>
              <th scope="col">{__('Waiting')}</th>
              {why ? <th scope="col">{__('Why there')}</th> : null}
            </tr>
          </thead>
          <tbody>
            {props.view.queue.map(q => (
              <tr key={q.position}>
                <td>{q.position}</td>
                <td>{q.owner}</td>
                <td title={q.notebook}>{q.notebook}</td>
                <td>{q.what}</td>
                <td>{q.profile}</td>
                <td>{q.waiting}</td>
                {why ? <td className="jp-GpuPool-whyCell">{q.why}</td> : null}
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </>
  );
}

function LeaseSection(props: { view: IDashboardView; actions: IAdminActions }): JSX.Element {
  const [busy, setBusy] = React.useState<string | null>(null);
  const act = async (row: ILeaseRow, action: AdminAction, opener: HTMLElement) => {
    setBusy(`${row.kernelId}:${action}`);
    try {
      await props.actions.act(row, action, opener);
    } finally {
      setBusy(null);
    }
  };
  const { leases } = props.view;
  return (
    <section aria-labelledby="jp-GpuPool-dash-leases">
      <h2 id="jp-GpuPool-dash-leases" className="jp-GpuPool-sectionTitle">
        {__('Kernels holding the pool (%1)', leases.length)}
      </h2>
      {leases.length === 0 ? (
        <p className="jp-GpuPool-empty">{__('No kernel holds a slice.')}</p>
      ) : (
        <div className="jp-GpuPool-tableScroll">
          <table className="jp-GpuPool-table jp-GpuPool-leaseTable">
            <thead>
              <tr>
                <th scope="col">{__('User')}</th>
                <th scope="col">{__('Notebook')}</th>
                <th scope="col">{__('Profile')}</th>
                <th scope="col">{__('GPU')}</th>
                <th scope="col">{__('State')}</th>
                <th scope="col">{__('Age')}</th>
                <th scope="col">{__('Idle')}</th>
                <th scope="col">{__('Actions')}</th>
              </tr>
            </thead>
            <tbody>
              {leases.map(l => (
                <LeaseRow key={l.id} row={l} busy={busy} act={act} actions={props.actions} />
              ))}
            </tbody>
          </table>
        </div>
      )}
      <QueueTable view={props.view} />
    </section>
  );
}

/** "released (hibernate) · dry run": the kind, the action where it adds to it, a dry run marked. */
export function decisionWhat(r: IDecisionRow): string {
  const kind = kindWord(r.kind);
  const what =
    r.action && ['warned', 'released', 'refused'].includes(r.kind)
      ? __('%1 (%2)', kind, kindWord(r.action))
      : kind;
  return r.dryRun ? __('%1 · dry run', what) : what;
}

export function DecisionLog(props: { view: IDashboardView }): JSX.Element {
  const [filter, setFilter] = React.useState<IDecisionFilter>({ text: '', kind: '', user: '' });
  const rows = props.view.decisions;
  const kinds = [...new Set(rows.map(r => r.kind))].sort();
  const users = [...new Set(rows.map(r => r.user).filter(Boolean))].sort();
  const shown = filterDecisions(rows, filter);
  return (
    <section aria-labelledby="jp-GpuPool-dash-log">
      <h2 id="jp-GpuPool-dash-log" className="jp-GpuPool-sectionTitle">
        {__('Decision log')}
      </h2>
      <div className="jp-GpuPool-filters" role="search" aria-label={__('Filter the decision log')}>
        <label>
          {__('Search')}{' '}
          <input
            type="search"
            className="jp-GpuPool-input"
            value={filter.text}
            placeholder={__('notebook, reason, rule…')}
            onChange={e => setFilter({ ...filter, text: e.target.value })}
          />
        </label>
        <label>
          {__('What')}{' '}
          <select
            className="jp-GpuPool-input"
            value={filter.kind}
            onChange={e => setFilter({ ...filter, kind: e.target.value })}
          >
            <option value="">{__('everything')}</option>
            {kinds.map(k => (
              <option key={k} value={k}>
                {kindWord(k)}
              </option>
            ))}
          </select>
        </label>
        <label>
          {__('User')}{' '}
          <select
            className="jp-GpuPool-input"
            value={filter.user}
            onChange={e => setFilter({ ...filter, user: e.target.value })}
          >
            <option value="">{__('everyone')}</option>
            {users.map(u => (
              <option key={u} value={u}>
                {u}
              </option>
            ))}
          </select>
        </label>
        <span className="jp-GpuPool-muted" role="status">
          {__('%1 of %2 shown', shown.length, rows.length)}
        </span>
      </div>
      <table className="jp-GpuPool-table jp-GpuPool-logTable">
        <thead>
          <tr>
            <th scope="col">{__('Time')}</th>
            <th scope="col">{__('User')}</th>
            <th scope="col">{__('Notebook')}</th>
            <th scope="col">{__('Profile')}</th>
            <th scope="col">{__('What')}</th>
            <th scope="col">{__('Reason')}</th>
            <th scope="col">{__('Rule')}</th>
          </tr>
        </thead>
        <tbody>
          {shown.map(r => (
            <tr key={r.key} title={r.message} className={r.dryRun ? 'jp-mod-dryRun' : undefined}>
              <td>{r.time}</td>
              <td>{r.user}</td>
              <td className="jp-GpuPool-nameCell">{r.notebook}</td>
              <td title={r.profileId}>{r.profile}</td>
              <td>{decisionWhat(r)}</td>
              <td>{r.reason}</td>
              <td>{r.rule}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </section>
  );
}

function BudgetSection(props: { view: IDashboardView }): JSX.Element {
  const rows = props.view.budgets;
  return (
    <section aria-labelledby="jp-GpuPool-dash-budgets">
      <h2 id="jp-GpuPool-dash-budgets" className="jp-GpuPool-sectionTitle">
        {__('GPU time')}
      </h2>
      {rows.length === 0 ? (
        <p className="jp-GpuPool-empty">{__('No GPU-hour budgets are set (GPUPool.budgets).')}</p>
      ) : (
        <table className="jp-GpuPool-table jp-GpuPool-budgetTable">
          <thead>
            <tr>
              <th scope="col">{__('User')}</th>
              <th scope="col">{__('Budget')}</th>
              <th scope="col">{__('Used')}</th>
              <th scope="col">{__('Resets')}</th>
            </tr>
          </thead>
          <tbody>
            {rows.map(b => (
              <tr key={`${b.user}-${b.scope}`}>
                <td>{b.user}</td>
                <td>{b.scope}</td>
                <td>
                  <span className="jp-GpuPool-cellText">{b.text}</span>
                  <Bar fraction={b.fraction} label={`${b.user}: ${b.text}`} level={b.level} />
                </td>
                <td>{b.resets}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </section>
  );
}

function dashTabs(): Array<{ id: TabId; label: string }> {
  return [
    { id: 'gpus', label: __('GPUs and kernels') },
    { id: 'decisions', label: __('Decision log') },
    { id: 'budgets', label: __('GPU time') }
  ];
}

function DashHeader(props: { view: IDashboardView; error: string | null }): JSX.Element {
  const { view } = props;
  return (
    <header className="jp-GpuPool-dashHeader">
      <h1 className="jp-GpuPool-panelTitle">{__('GPU pool dashboard')}</h1>
      <p className="jp-GpuPool-note">
        {view.note}
        {view.declared ? (
          <span className="jp-GpuPool-badge">
            {__('declared GPUs (demo): kernels hold no real GPU memory')}
          </span>
        ) : null}
      </p>
      {view.dryRun ? (
        <p className="jp-GpuPool-dryRun">
          {__('Policy in dry-run mode: decisions are recorded, not carried out.')}
        </p>
      ) : null}
      {props.error ? <p className="jp-GpuPool-empty">{props.error}</p> : null}
    </header>
  );
}

export function Dashboard(props: {
  pool: IPool | null;
  telemetry: ITelemetry | null;
  error: string | null;
  telemetryError: string | null;
  now: number;
  actions: IAdminActions;
  /** GET me's profiles: the launcher names the tables show. */
  profiles?: IProfile[];
}): JSX.Element {
  const [tab, setTab] = React.useState<TabId>('gpus');
  if (!props.pool) {
    return (
      <div className="jp-GpuPool-dashboard">
        <p className="jp-GpuPool-empty">{props.error ?? __('Reading the pool…')}</p>
      </div>
    );
  }
  const view = dashboardView(props.pool, props.now, props.profiles);
  return (
    <div className="jp-GpuPool-dashboard">
      <DashHeader view={view} error={props.error} />
      <Tabs
        label={__('Dashboard views')}
        tabs={dashTabs()}
        selected={tab}
        onSelect={id => setTab(id as TabId)}
        idPrefix="jp-GpuPool-dash"
      />
      <div
        className="jp-GpuPool-tabpanel"
        role="tabpanel"
        id={`jp-GpuPool-dash-panel-${tab}`}
        aria-labelledby={`jp-GpuPool-dash-tab-${tab}`}
        tabIndex={0}
      >
        {tab === 'gpus' ? (
          <>
            <GpuSection
              view={view}
              telemetry={props.telemetry}
              telemetryError={props.telemetryError}
              bands={reservationBands(props.pool, props.now)}
            />
            <ReservationTable view={view} />
            <LeaseSection view={view} actions={props.actions} />
          </>
        ) : tab === 'decisions' ? (
          <DecisionLog view={view} />
        ) : (
          <BudgetSection view={view} />
        )}
      </div>
    </div>
  );
}
