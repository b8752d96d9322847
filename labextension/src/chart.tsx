/**
 * A stacked time-series plot drawn by uPlot: one band per kernel, so that the
 * plot shows each kernel's share of a GPU over time. The legend is our own HTML
 * (readable by screen readers and themable); the canvas carries a text summary.
 */

import * as React from 'react';
import uPlot from 'uplot';

import { formatClock, formatClockSeconds } from './format';
import { __ } from './i18n';
import { latestValue, type IStackedSeries } from './admin';
import type { IReservationBand } from './reservations';

function themeColour(name: string, fallback: string): string {
  const value = getComputedStyle(document.body).getPropertyValue(name).trim();
  return value || fallback;
}

/** Diagonal lines in `colour`: the lead time, when a reservation's room is being made. */
function hatch(ctx: CanvasRenderingContext2D, colour: string): CanvasPattern | string {
  const tile = document.createElement('canvas');
  tile.width = tile.height = 8;
  const pen = tile.getContext('2d');
  if (!pen) {
    return colour + '33';
  }
  pen.strokeStyle = colour + '99';
  pen.lineWidth = 1.5;
  pen.beginPath();
  pen.moveTo(-1, 9);
  pen.lineTo(9, -1);
  pen.stroke();
  return ctx.createPattern(tile, 'repeat') ?? colour + '33';
}

/**
 * The reservations' room behind the kernels' bands: hatched from its lead time (its room being made),
 * shaded while open, within the plot's window. Drawn first, under the series.
 */
function drawReservations(u: uPlot, bands: () => ReadonlyArray<IReservationBand>): void {
  const ctx = u.ctx;
  const { left, top, width, height } = u.bbox;
  const x = (t: number) => Math.min(left + width, Math.max(left, u.valToPos(t, 'x', true)));
  const colour = themeColour('--jp-warn-color2', '#ffb74d');
  const making = hatch(ctx, colour);
  ctx.save();
  for (const b of bands()) {
    const [from, open, to] = [x(b.from), x(b.open), x(b.to)];
    if (open > from) {
      ctx.fillStyle = making;
      ctx.fillRect(from, top, open - from, height);
    }
    if (to > open) {
      ctx.fillStyle = colour + '66';
      ctx.fillRect(open, top, to - open, height);
    }
    if (to > from) {
      ctx.strokeStyle = colour;
      ctx.lineWidth = 1;
      ctx.strokeRect(from + 0.5, top + 0.5, to - from - 1, height - 1);
    }
  }
  ctx.restore();
}

function options(
  data: IStackedSeries,
  width: number,
  height: number,
  span: () => [number, number],
  bands: () => ReadonlyArray<IReservationBand> = () => []
): uPlot.Options {
  const text = themeColour('--jp-ui-font-color1', '#333');
  const grid = themeColour('--jp-border-color2', '#ddd');
  const axis = (values?: uPlot.Axis['values']): uPlot.Axis => ({
    stroke: text,
    grid: { stroke: grid, width: 1 },
    ticks: { stroke: grid, width: 1 },
    font: '11px system-ui, sans-serif',
    ...(values ? { values } : {})
  });
  // The top of the stack first: each band is filled down to zero and the ones below are drawn over it.
  // Steps: a reading holds until the next one (what the stacked values mean).
  const steps = uPlot.paths.stepped!({ align: 1 });
  const series: uPlot.Series[] = [...data.series].reverse().map(s => ({
    label: s.label,
    stroke: s.colour,
    fill: s.colour + 'cc',
    width: 1,
    paths: steps,
    points: { show: false }
  }));
  return {
    width,
    height,
    legend: { show: false },
    cursor: { drag: { x: false, y: false } },
    scales: {
      // The whole window, whatever the readings: the axis neither starts at the first reading nor
      // jumps when a poll brings new data (span() reads the latest data's window).
      x: { time: true, range: () => span() },
      y: { range: [0, Math.max(data.max, 1)] }
    },
    axes: [
      // A short window needs the seconds to tell its ticks apart.
      axis((_u, splits) => {
        const [from, to] = span();
        return splits.map(t => (to - from < 1800 ? formatClockSeconds(t) : formatClock(t)));
      }),
      axis((_u, splits) => splits.map(v => `${Math.round(v)}${data.unit === '%' ? '%' : ''}`))
    ],
    series: [{}, ...series],
    hooks: { drawClear: [u => drawReservations(u, bands)] }
  };
}

function aligned(data: IStackedSeries): uPlot.AlignedData {
  return [data.times, ...[...data.series].reverse().map(s => s.stacked)];
}

/**
 * The uPlot of `data` in the returned element: made anew for a new set of kernels (or theme), given new
 * data as it comes; its time axis is `data`'s window, and `bands` are drawn behind the series.
 */
function usePlot(
  data: IStackedSeries,
  height: number,
  bands: ReadonlyArray<IReservationBand>
): React.RefObject<HTMLDivElement> {
  const host = React.useRef<HTMLDivElement>(null);
  const plot = React.useRef<uPlot | null>(null);
  const span = React.useRef<[number, number]>([data.from, data.to]);
  span.current = [data.from, data.to];
  const drawn = React.useRef(bands);
  drawn.current = bands;
  const shape =
    data.series.map(s => s.key).join('|') + `|${data.max}|${document.body.dataset.jpThemeLight}`;

  React.useEffect(() => {
    const node = host.current;
    if (!node) {
      return;
    }
    const width = Math.max(node.clientWidth, 200);
    plot.current = new uPlot(
      options(
        data,
        width,
        height,
        () => span.current,
        () => drawn.current
      ),
      aligned(data),
      node
    );
    const resize = new ResizeObserver(() => {
      plot.current?.setSize({ width: Math.max(node.clientWidth, 200), height });
    });
    resize.observe(node);
    return () => {
      resize.disconnect();
      plot.current?.destroy();
      plot.current = null;
    };
  }, [shape, height]); // a new set of kernels (or theme) is a new plot; new readings are new data

  React.useEffect(() => {
    plot.current?.setData(aligned(data));
  }, [data]);
  return host;
}

/**
 * A stacked plot with a caption, a text summary for screen readers and a legend table; `bands`: the
 * reservations keeping room on its GPU, drawn behind the kernels and listed under them.
 */
export function StackedChart(props: {
  title: string;
  data: IStackedSeries;
  height?: number;
  bands?: ReadonlyArray<IReservationBand>;
}): JSX.Element {
  const { data, title } = props;
  const height = props.height ?? 140;
  // Within the window only: a reservation of next week is the list's, not the plot's.
  const shown = (props.bands ?? []).filter(b => b.to > data.from && b.from < data.to);
  const host = usePlot(data, height, shown);
  const reserved = shown.length ? __('; reserved: %1', shown.map(b => b.label).join('; ')) : '';
  return (
    <figure
      className="jp-GpuPool-chart"
      data-series={data.series.length}
      data-points={data.times.length}
      data-reservations={shown.length}
    >
      <figcaption className="jp-GpuPool-chartTitle">{title}</figcaption>
      <div
        className="jp-GpuPool-chartPlot"
        ref={host}
        role="img"
        aria-label={`${title}: ${data.summary}${reserved}`}
      />
      <Legend title={title} data={data} bands={shown} />
    </figure>
  );
}

/** The plot's legend as a table: each kernel with its value now, then each reservation's band. */
function Legend(props: {
  title: string;
  data: IStackedSeries;
  bands: ReadonlyArray<IReservationBand>;
}): JSX.Element {
  const { data, bands } = props;
  const latest = (s: IStackedSeries['series'][number]) => {
    const v = latestValue(s); // none for a kernel hibernated or ended
    return v === null
      ? '–'
      : data.unit === '%'
        ? `${Math.round(v)}%`
        : `${Math.round(v * 10) / 10} GiB`;
  };
  const none = data.series.length ? null : (
    <p className="jp-GpuPool-empty">{__('No kernel on this GPU in the last 10 minutes.')}</p>
  );
  if (!bands.length) {
    return none ?? <LegendTable {...props} latest={latest} />;
  }
  return (
    <>
      {none}
      <LegendTable {...props} latest={latest} />
    </>
  );
}

function LegendTable(props: {
  title: string;
  data: IStackedSeries;
  bands: ReadonlyArray<IReservationBand>;
  latest: (s: IStackedSeries['series'][number]) => string;
}): JSX.Element {
  const { data, bands, latest } = props;
  return (
    <table className="jp-GpuPool-legend">
      <caption className="jp-GpuPool-srOnly">{__('%1, now', props.title)}</caption>
      <tbody>
        {data.series.map(s => (
          <tr key={s.key}>
            <td>
              <span
                className="jp-GpuPool-swatch"
                style={{ background: s.colour }}
                aria-hidden="true"
              />
              {s.label}
            </td>
            <td className="jp-GpuPool-legendValue">{latest(s)}</td>
          </tr>
        ))}
        {bands.map(b => (
          <tr key={`reservation-${b.name}-${b.open}`} className="jp-GpuPool-legendReservation">
            <td colSpan={2}>
              <span className="jp-GpuPool-swatch jp-mod-reserved" aria-hidden="true" />
              {b.label}
            </td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}
