/**
 * The Lumino widgets JupyterLab places: the status bar item, the GPU side
 * panel and the notebook toolbar's slice indicator. Each re-renders when the
 * model changes.
 */

import type { ISessionContext } from '@jupyterlab/apputils';
import { LabIcon, ReactWidget, UseSignal } from '@jupyterlab/ui-components';
import type { Message } from '@lumino/messaging';
import * as React from 'react';

import { IActions, MyKernels, PoolPanel, StatusItem } from './components';
import type { PoolModel } from './model';
import { indicatorView, statusView } from './view';

const GPU_SVG = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="M4 7h14a2 2 0 0 1 2 2v6a2 2 0 0 1-2 2H4zm3 3v4h2v-4zm4 0v4h2v-4zm4 0v4h2v-4z"/>
    <path d="M2 5h2v14H2zM6 17h2v3H6zm4 0h2v3h-2zm4 0h2v3h-2z"/>
  </g>
</svg>`;

export const gpuIcon = new LabIcon({ name: 'jupyter-gpu-pool:gpu', svgstr: GPU_SVG });

export class StatusWidget extends ReactWidget {
  constructor(
    private readonly _model: PoolModel,
    private readonly _open: () => void
  ) {
    super();
    this.addClass('jp-GpuPool-statusItem');
  }

  render(): JSX.Element {
    return (
      <UseSignal signal={this._model.changed}>
        {() => (
          <StatusItem
            me={this._model.me}
            error={this._model.error}
            now={this._model.serverNow()}
            onOpen={this._open}
          />
        )}
      </UseSignal>
    );
  }
}

/** Re-render every second while a countdown is shown, so that it ticks. */
function useTick(active: boolean): void {
  const [, setTick] = React.useState(0);
  React.useEffect(() => {
    if (!active) {
      return;
    }
    const timer = window.setInterval(() => setTick(t => t + 1), 1000);
    return () => window.clearInterval(timer);
  }, [active]);
}

function PanelBody(props: {
  model: PoolModel;
  actions: IActions;
  visible: boolean;
}): JSX.Element {
  const { model } = props;
  const [tab, setTab] = React.useState<'mine' | 'pool'>('mine');
  const me = model.me;
  const admin = !!me?.admin && !!me?.pool.enabled;
  React.useEffect(() => {
    model.poolWanted = props.visible && admin && tab === 'pool';
  }, [props.visible, admin, tab]);
  useTick(props.visible && !!me?.kernels.some(k => k.warning));
  const now = model.serverNow();
  const status = statusView(me, model.error, now);
  let body: JSX.Element;
  if (!me) {
    body = <p className="jp-GpuPool-empty">{status.title}</p>;
  } else if (!me.pool.enabled) {
    body = (
      <p className="jp-GpuPool-empty">
        No GPU pool on this server. {me.pool.note}
      </p>
    );
  } else if (tab === 'pool' && admin) {
    body = <PoolPanel pool={model.pool} error={model.poolError} now={now} />;
  } else {
    body = <MyKernels me={me} now={now} actions={props.actions} />;
  }
  const onTabKey = (event: React.KeyboardEvent) => {
    if (event.key === 'ArrowRight' || event.key === 'ArrowLeft') {
      setTab(tab === 'mine' ? 'pool' : 'mine');
      event.preventDefault();
    }
  };
  return (
    <div className="jp-GpuPool-panelBody">
      <div className="jp-GpuPool-panelHeader">
        <h1 className="jp-GpuPool-panelTitle">GPU pool</h1>
        <span
          className={`jp-GpuPool-pill jp-mod-${status.level} jp-GpuPool-headerStatus`}
          title={status.title.replace(/\n?Click to open the GPU panel\.$/, '')}
        >
          {status.text}
        </span>
      </div>
      {admin ? (
        <div className="jp-GpuPool-tabs" role="tablist" aria-label="GPU pool views" onKeyDown={onTabKey}>
          {(['mine', 'pool'] as const).map(t => (
            <button
              key={t}
              role="tab"
              id={`jp-GpuPool-tab-${t}`}
              aria-selected={tab === t}
              aria-controls="jp-GpuPool-tabpanel"
              tabIndex={tab === t ? 0 : -1}
              className={`jp-GpuPool-tab${tab === t ? ' jp-mod-active' : ''}`}
              onClick={() => setTab(t)}
            >
              {t === 'mine' ? 'My kernels' : 'Whole pool'}
            </button>
          ))}
        </div>
      ) : null}
      <div
        id="jp-GpuPool-tabpanel"
        role={admin ? 'tabpanel' : undefined}
        aria-labelledby={admin ? `jp-GpuPool-tab-${tab}` : undefined}
      >
        {body}
      </div>
    </div>
  );
}

export class GpuPanel extends ReactWidget {
  constructor(
    private readonly _model: PoolModel,
    private readonly _actions: IActions
  ) {
    super();
    this.id = 'jp-gpu-pool-panel';
    this.addClass('jp-GpuPool-panel');
    this.title.icon = gpuIcon;
    this.title.caption = 'GPU pool: your GPU kernels and quota';
    this.node.setAttribute('role', 'region');
    this.node.setAttribute('aria-label', 'GPU pool');
  }

  render(): JSX.Element {
    return (
      <UseSignal signal={this._model.changed}>
        {() => <PanelBody model={this._model} actions={this._actions} visible={this.isVisible} />}
      </UseSignal>
    );
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this.update();
    void this._model.refresh();
  }

  protected onAfterHide(msg: Message): void {
    super.onAfterHide(msg);
    this._model.poolWanted = false;
    this.update();
  }
}

/** "GPU 10 GiB · GPU 0" next to the notebook's kernel name. */
export class SliceIndicator extends ReactWidget {
  constructor(
    private readonly _model: PoolModel,
    private readonly _session: ISessionContext,
    private readonly _open: () => void
  ) {
    super();
    this.addClass('jp-GpuPool-indicator');
    _session.kernelChanged.connect(this.update, this);
  }

  render(): JSX.Element {
    return (
      <UseSignal signal={this._model.changed}>
        {() => {
          const v = indicatorView(this._model.me, this._session.session?.kernel?.id ?? null);
          if (!v.visible) {
            return <span className="jp-GpuPool-indicatorEmpty" />;
          }
          return (
            <button
              className={`jp-GpuPool-indicatorButton jp-mod-${v.kind}`}
              title={v.title}
              aria-label={`GPU slice of this kernel: ${v.text}. Open the GPU panel.`}
              onClick={this._open}
            >
              <gpuIcon.react tag="span" className="jp-GpuPool-indicatorIcon" />
              <span className="jp-GpuPool-indicatorText">{v.text}</span>
            </button>
          );
        }}
      </UseSignal>
    );
  }
}
