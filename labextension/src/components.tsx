/**
 * The React components of the GPU panel: quota bars, one card per kernel, the
 * admins' pool view. They lay out the view models of view.ts and call back for
 * actions; they hold no state of the pool themselves.
 */

import * as React from 'react';

import { baseName, formatAgo, formatBytes } from './format';
import type { IMe, IPool, KernelAction } from './types';
import {
  cardView,
  ICardView,
  IPoolView,
  IQuotaBar,
  poolView,
  quotaBars,
  statusView
} from './view';

export interface IActions {
  run(kernelId: string, action: KernelAction, confirm: string | null): Promise<void>;
  open(path: string): void;
}

/** A horizontal bar: a share of something, its label and text above it. */
export function Meter(props: {
  label: string;
  text: string;
  fraction: number | null;
  level?: string;
  note?: string;
}): JSX.Element {
  const pct = props.fraction === null ? null : Math.round(props.fraction * 100);
  return (
    <div className="jp-GpuPool-meter">
      <div className="jp-GpuPool-meterHead">
        <span className="jp-GpuPool-meterLabel">
          {props.label}
          {props.note ? <span className="jp-GpuPool-meterNote"> · {props.note}</span> : null}
        </span>
        <span className="jp-GpuPool-meterText">{props.text}</span>
      </div>
      <div
        className={`jp-GpuPool-meterTrack jp-mod-${props.level ?? 'ok'}`}
        role="meter"
        aria-label={`${props.label}: ${props.text}${props.note ? `, ${props.note}` : ''}`}
        aria-valuemin={0}
        aria-valuemax={100}
        aria-valuenow={pct ?? undefined}
        aria-valuetext={props.text}
      >
        <div
          className={`jp-GpuPool-meterFill${pct === null ? ' jp-mod-unknown' : ''}`}
          style={{ width: `${pct === null ? 100 : pct}%` }}
        />
      </div>
    </div>
  );
}

/** Utilization over the last minutes as an SVG line (0..100% bottom to top). */
export function Sparkline(props: { points: string; label: string; text: string }): JSX.Element {
  return (
    <div className="jp-GpuPool-meter jp-GpuPool-spark">
      <div className="jp-GpuPool-meterHead">
        <span className="jp-GpuPool-meterLabel" title="GPU utilization over the last 5 minutes">
          Utilization
        </span>
        <span className="jp-GpuPool-meterText">{props.text}</span>
      </div>
      {props.points ? (
      <svg
        className="jp-GpuPool-sparkSvg"
        viewBox="0 0 100 24"
        preserveAspectRatio="none"
        role="img"
        aria-label={props.label}
      >
        <title>{props.label}</title>
        <line className="jp-GpuPool-sparkBase" x1="0" y1="23.5" x2="100" y2="23.5" />
        {props.points.includes(' ') ? <polyline className="jp-GpuPool-sparkLine" points={props.points} /> : null}
      </svg>
      ) : null}
    </div>
  );
}

export function KernelCard(props: { view: ICardView; actions: IActions }): JSX.Element {
  const v = props.view;
  const [busy, setBusy] = React.useState<KernelAction | null>(null);
  const run = async (action: KernelAction, confirm: string | null) => {
    setBusy(action);
    try {
      await props.actions.run(v.kernelId, action, confirm);
    } finally {
      setBusy(null);
    }
  };
  const headingId = `jp-GpuPool-card-${v.kernelId}`;
  return (
    <section
      className={`jp-GpuPool-card jp-mod-${v.state.kind}${v.countdown ? ' jp-mod-warned' : ''}`}
      aria-labelledby={headingId}
      data-kernel-id={v.kernelId}
    >
      <header className="jp-GpuPool-cardHeader">
        <h3 id={headingId} className="jp-GpuPool-cardTitle">
          {v.path.endsWith('.ipynb') ? (
            <button
              className="jp-GpuPool-link"
              title={`Open ${v.path}`}
              onClick={() => props.actions.open(v.path)}
            >
              {v.title}
            </button>
          ) : (
            v.title
          )}
        </h3>
        <span className="jp-GpuPool-profile" title={v.sliceLabel ? `slice ${v.sliceLabel}` : undefined}>
          {v.profile}
        </span>
      </header>
      <div className="jp-GpuPool-gpu">{v.gpu}</div>
      <div className={`jp-GpuPool-state jp-mod-${v.state.kind}`}>
        <span className="jp-GpuPool-stateDot" aria-hidden="true" />
        {v.state.label}
      </div>
      <Meter
        label="Memory"
        note={v.memory.note}
        text={v.memory.text}
        fraction={v.memory.fraction}
        level={v.memory.fraction !== null && v.memory.fraction >= 0.9 ? 'near' : 'ok'}
      />
      <Sparkline points={v.utilization.points} label={v.utilization.label} text={v.utilization.text} />
      {v.countdown ? (
        <div className="jp-GpuPool-countdown" role="status" title={v.countdown.detail}>
          <strong className="jp-GpuPool-countdownTime">{v.countdown.text}</strong>
          <span className="jp-GpuPool-countdownWhy">{v.countdown.message}</span>
        </div>
      ) : null}
      {v.actions.length ? (
        <div className="jp-GpuPool-actions" role="group" aria-label={`Actions for ${v.title}`}>
          {v.actions.map(a => (
            <button
              key={a.action}
              className={`jp-Button jp-GpuPool-action jp-mod-${a.action}${
                a.action === 'snooze' && v.countdown ? ' jp-mod-accept' : ''
              }`}
              title={a.title}
              aria-label={`${a.label}: ${v.title}`}
              disabled={busy !== null}
              onClick={() => void run(a.action, a.confirm)}
            >
              {busy === a.action ? `${a.label}…` : a.label}
            </button>
          ))}
        </div>
      ) : null}
    </section>
  );
}

function QuotaSection(props: { me: IMe }): JSX.Element {
  const bars: IQuotaBar[] = quotaBars(props.me);
  return (
    <section className="jp-GpuPool-quota" aria-label="Your GPU quota">
      {bars.map(b => (
        <Meter key={b.label} label={b.label} text={b.text} fraction={b.fraction} level={b.level} />
      ))}
      {props.me.groups.map(g => (
        <Meter
          key={`group-${g.name}`}
          label={`Group ${g.name}`}
          text={
            g.quota.memory
              ? `${formatBytes(g.usage.memory)} of ${formatBytes(g.quota.memory)}`
              : `${formatBytes(g.usage.memory)} (no quota)`
          }
          fraction={g.quota.memory ? Math.min(1, g.usage.memory / g.quota.memory) : null}
        />
      ))}
    </section>
  );
}

/** What the user's history lists: what was done to their kernels (warnings show as countdowns). */
const HISTORY_KINDS = new Set(['culled', 'hibernated', 'resumed', 'released', 'refused', 'reclaimed', 'over_memory', 'queued']);

export function MyKernels(props: { me: IMe; now: number; actions: IActions }): JSX.Element {
  const { me, now } = props;
  const recent = [...me.recent]
    .filter(r => HISTORY_KINDS.has(r.kind))
    .sort((a, b) => b.at - a.at)
    .slice(0, 8);
  return (
    <div className="jp-GpuPool-mine">
      <QuotaSection me={me} />
      <h2 className="jp-GpuPool-sectionTitle">Your GPU kernels</h2>
      {me.kernels.length === 0 ? (
        <p className="jp-GpuPool-empty">
          No kernel of yours holds a GPU slice. Start one from the launcher with a GPU kernel
          (“Python 3 · GPU …”).
        </p>
      ) : (
        me.kernels.map(k => <KernelCard key={k.kernel_id} view={cardView(k, now)} actions={props.actions} />)
      )}
      {me.queue.length ? (
        <>
          <h2 className="jp-GpuPool-sectionTitle">Waiting for a slice</h2>
          <ul className="jp-GpuPool-list">
            {me.queue.map(q => (
              <li key={`${q.kernel_id}-${q.position}`}>
                #{q.position} · {q.profile} · {q.for === 'resume' ? 'resume' : 'start'}
              </li>
            ))}
          </ul>
        </>
      ) : null}
      {recent.length ? (
        <>
          <h2 className="jp-GpuPool-sectionTitle">What happened</h2>
          <ul className="jp-GpuPool-list jp-GpuPool-recent">
            {recent.map((r, i) => (
              <li key={`${r.at}-${r.kernel_id}-${i}`}>
                <span className="jp-GpuPool-when">{formatAgo(now, r.at)}</span>{' '}
                {r.name ? <strong>{baseName(r.name)}</strong> : null} {r.message}
              </li>
            ))}
          </ul>
        </>
      ) : null}
      <p className="jp-GpuPool-note">{me.pool.note}</p>
    </div>
  );
}

export function PoolPanel(props: { pool: IPool | null; error: string | null; now: number }): JSX.Element {
  if (!props.pool) {
    return <p className="jp-GpuPool-empty">{props.error ?? 'Reading the pool…'}</p>;
  }
  const v: IPoolView = poolView(props.pool, props.now);
  return (
    <div className="jp-GpuPool-pool">
      <p className="jp-GpuPool-note">{v.note}</p>
      {v.dryRun ? (
        <p className="jp-GpuPool-dryRun">Policy in dry-run mode: decisions are recorded, not carried out.</p>
      ) : null}
      <h2 className="jp-GpuPool-sectionTitle">GPUs</h2>
      {v.gpus.map(g => (
        <div key={g.uuid} className="jp-GpuPool-poolGpu">
          <div className="jp-GpuPool-poolGpuName">
            {g.label}
            {g.exclusive ? ' · exclusive' : ''}
          </div>
          <Meter label="Memory" text={g.memoryText} fraction={g.fraction} level={g.fraction >= 0.9 ? 'near' : 'ok'} />
          <div className="jp-GpuPool-poolGpuUtil">Utilization {g.utilization}</div>
        </div>
      ))}
      <h2 className="jp-GpuPool-sectionTitle">Leases by user</h2>
      {v.owners.length === 0 ? <p className="jp-GpuPool-empty">No leases.</p> : null}
      {v.owners.map(o => (
        <div key={o.owner} className="jp-GpuPool-owner">
          <div className="jp-GpuPool-ownerName">
            {o.owner} · {o.memoryText}
          </div>
          <ul className="jp-GpuPool-list">
            {o.leases.map(l => (
              <li key={l.id} className={`jp-mod-${l.state}`}>
                {l.text} · {l.state}
              </li>
            ))}
          </ul>
        </div>
      ))}
      <h2 className="jp-GpuPool-sectionTitle">Queue</h2>
      {v.queue.length === 0 ? (
        <p className="jp-GpuPool-empty">Empty.</p>
      ) : (
        <ol className="jp-GpuPool-list">
          {v.queue.map(q => (
            <li key={q.position}>{q.text}</li>
          ))}
        </ol>
      )}
      <h2 className="jp-GpuPool-sectionTitle">Recent policy decisions</h2>
      {v.decisions.length === 0 ? (
        <p className="jp-GpuPool-empty">None yet.</p>
      ) : (
        <ul className="jp-GpuPool-list jp-GpuPool-recent">
          {v.decisions.map(d => (
            <li key={d.key}>
              <span className="jp-GpuPool-when">{d.when}</span> {d.dryRun ? '(dry run) ' : ''}
              {d.text}
            </li>
          ))}
        </ul>
      )}
    </div>
  );
}

/** The status bar item: text and colour from statusView; a button that opens the panel. */
export function StatusItem(props: {
  me: IMe | null;
  error: string | null;
  now: number;
  onOpen: () => void;
}): JSX.Element {
  const v = statusView(props.me, props.error, props.now);
  return (
    <button
      className={`jp-GpuPool-pill jp-GpuPool-status jp-mod-${v.level}`}
      title={v.title}
      aria-label={`GPU pool: ${v.text}${v.level === 'warning' ? ', an idle action is pending' : v.level === 'near' ? ', close to your quota' : ''}. Open the GPU panel.`}
      onClick={props.onOpen}
    >
      <span className="jp-GpuPool-statusDot" aria-hidden="true" />
      <span className="jp-GpuPool-statusText">{v.text}</span>
    </button>
  );
}
