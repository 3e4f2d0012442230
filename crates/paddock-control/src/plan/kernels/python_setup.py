# Run silently in every Python code context when it starts (paddock's plan/code.rs). It teaches
# IPython one more display format, `application/vnd.paddock.chart+json`: the data of a matplotlib
# figure (its type, title, axes and elements) beside the PNG the inline backend draws. The shapes
# are those E2B's code-interpreter SDK reads (line, scatter, bar, pie, box-and-whisker, and a
# "superchart" for a figure of several axes). Nothing here runs until a figure is displayed, and a
# figure it cannot read gets no chart, never an error.
def __paddock_setup():
    import math

    from IPython import get_ipython
    from IPython.core.formatters import JSONFormatter

    shell = get_ipython()
    if shell is None:
        return

    def number(v):
        try:
            f = float(v)
        except (TypeError, ValueError):
            return str(v)
        return f if math.isfinite(f) else None

    def ticks(axis, texts):
        values = [number(v) for v in axis.get_ticklocs()]
        labels = [t.get_text() for t in texts()]
        return values, labels

    def axes_2d(ax):
        x_ticks, x_tick_labels = ticks(ax.xaxis, ax.get_xticklabels)
        y_ticks, y_tick_labels = ticks(ax.yaxis, ax.get_yticklabels)
        return {
            "title": ax.get_title() or None,
            "x_label": ax.get_xlabel() or None,
            "y_label": ax.get_ylabel() or None,
            "x_unit": None,
            "y_unit": None,
            "x_ticks": x_ticks,
            "x_tick_labels": x_tick_labels,
            "x_scale": ax.get_xscale(),
            "y_ticks": y_ticks,
            "y_tick_labels": y_tick_labels,
            "y_scale": ax.get_yscale(),
        }

    def label_of(artist, i):
        label = artist.get_label() or ""
        return label if label and not label.startswith("_") else "series %d" % i

    def boxes_of(ax):
        """A box plot's boxes, vertical or horizontal (matplotlib draws each as lines, or a patch
        with `patch_artist`): the box from the first to the third quartile, the median across it,
        the whiskers out to the minimum and the maximum, the outliers as markers. `None` when the
        axes hold no boxes, or boxes this cannot read."""
        from matplotlib.patches import PathPatch

        def span(values):
            return min(values), max(values)

        def data(line):
            return [float(v) for v in line.get_xdata()], [float(v) for v in line.get_ydata()]

        shapes = [data(line) for line in ax.get_lines()]
        patches = [
            ([float(v) for v in p.get_path().vertices[:, 0]], [float(v) for v in p.get_path().vertices[:, 1]])
            for p in ax.patches
            if isinstance(p, PathPatch)
        ]
        markers = [data(line) for line in ax.get_lines() if line.get_linestyle() in ("None", "none", " ", "")]

        def read(swap, ticks, texts):
            def oriented(xs, ys):
                return (ys, xs) if swap else (xs, ys)

            rects = []
            for xs, ys in [oriented(*s) for s in shapes if len(s[0]) == 5] + [oriented(*p) for p in patches]:
                if (xs[0], ys[0]) == (xs[-1], ys[-1]) and len(set(xs)) == 2 and len(set(ys)) == 2:
                    rects.append(span(xs) + span(ys))
            if not rects:
                return None
            segments = [oriented(*s) for s in shapes if len(s[0]) == 2]
            outlying = [oriented(*m) for m in markers if m[0]]
            tick_values = [number(v) for v in ticks()]
            tick_labels = [t.get_text() for t in texts()]
            elements = []
            for i, (x0, x1, q1, q3) in enumerate(sorted(rects)):
                center = (x0 + x1) / 2
                median = [ys[0] for xs, ys in segments if ys[0] == ys[1] and span(xs) == (x0, x1) and q1 <= ys[0] <= q3]
                low = [min(ys) for xs, ys in segments if xs[0] == xs[1] == center and max(ys) == q1]
                high = [max(ys) for xs, ys in segments if xs[0] == xs[1] == center and min(ys) == q3]
                if len(median) != 1 or len(low) != 1 or len(high) != 1:
                    return None
                outliers = [y for xs, ys in outlying if all(x == center for x in xs) for y in ys]
                label = next((l for v, l in zip(tick_values, tick_labels) if v == center and l), str(i + 1))
                elements.append({
                    "label": label,
                    "min": number(low[0]),
                    "first_quartile": number(q1),
                    "median": number(median[0]),
                    "third_quartile": number(q3),
                    "max": number(high[0]),
                    "outliers": [number(y) for y in outliers],
                })
            return elements

        elements = read(False, ax.get_xticks, ax.get_xticklabels)
        if elements is None:
            elements = read(True, ax.get_yticks, ax.get_yticklabels)
        if elements is None:
            return None
        base = axes_2d(ax)
        base.update({"type": "box_and_whisker", "elements": elements})
        return base

    def chart_of(ax):
        from matplotlib.collections import PathCollection
        from matplotlib.container import BarContainer
        from matplotlib.patches import Wedge

        wedges = [p for p in ax.patches if isinstance(p, Wedge)]
        if wedges:
            texts = [t.get_text() for t in ax.texts]
            return {
                "type": "pie",
                "title": ax.get_title() or None,
                "elements": [
                    {
                        "label": texts[i] if i < len(texts) else "slice %d" % i,
                        "angle": number(w.theta2 - w.theta1),
                        "radius": number(w.r),
                    }
                    for i, w in enumerate(wedges)
                ],
            }
        boxes = boxes_of(ax)
        if boxes is not None:
            return boxes
        bars = [c for c in ax.containers if isinstance(c, BarContainer)]
        if bars:
            base = axes_2d(ax)
            labels = base["x_tick_labels"]
            elements = []
            for gi, container in enumerate(bars):
                group = label_of(container, gi)
                for i, rect in enumerate(container.patches):
                    elements.append({
                        "label": labels[i] if i < len(labels) and labels[i] else str(i),
                        "group": group,
                        "value": number(rect.get_height()),
                    })
            base.update({"type": "bar", "elements": elements})
            return base
        scatters = [c for c in ax.collections if isinstance(c, PathCollection)]
        lines = [l for l in ax.get_lines() if len(l.get_xdata()) > 0]
        if scatters and not lines:
            base = axes_2d(ax)
            base.update({
                "type": "scatter",
                "elements": [
                    {"label": label_of(c, i), "points": [[number(x), number(y)] for x, y in c.get_offsets()]}
                    for i, c in enumerate(scatters)
                ],
            })
            return base
        if lines:
            base = axes_2d(ax)
            base.update({
                "type": "line",
                "elements": [
                    {"label": label_of(l, i), "points": [[number(x), number(y)] for x, y in zip(l.get_xdata(), l.get_ydata())]}
                    for i, l in enumerate(lines)
                ],
            })
            return base
        return None

    def chart(fig):
        try:
            charts = [c for c in (chart_of(ax) for ax in fig.get_axes()) if c is not None]
        except Exception:
            return None
        if not charts:
            return None
        if len(charts) == 1:
            return charts[0]
        title = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) else None
        return {"type": "superchart", "title": title, "elements": charts}

    class ChartFormatter(JSONFormatter):
        """Figures are recognised here rather than registered as a type printer: matplotlib's
        inline backend drops every format's printer for figures when it starts (at the first
        `import matplotlib.pyplot`, inside a cell), which would drop this one too."""

        format_type = "application/vnd.paddock.chart+json"
        print_method = "_repr_paddock_chart_"

        def __call__(self, obj):
            import sys

            module = sys.modules.get("matplotlib.figure")
            if module is not None and isinstance(obj, module.Figure):
                return chart(obj)
            return super().__call__(obj)

    display = shell.display_formatter
    formatter = ChartFormatter(parent=display)
    display.formatters[formatter.format_type] = formatter
    # The formats a display computes were fixed when the kernel started.
    if formatter.format_type not in display.active_types:
        display.active_types = list(display.active_types) + [formatter.format_type]


__paddock_setup()
del __paddock_setup
