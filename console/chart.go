package console

import (
	"html/template"
	"slices"
	"time"

	"github.com/tollgate/tollgate"
)

// The overview's charts: spend and tokens per day by model over the last
// chartDays days, as stacked bars in SVGs drawn here (no script, no chart
// library), each with a table of its figures for screen readers.

const (
	chartW, chartH = 720, 200 // the plot, in SVG units
	chartLeft      = 0
	barGap         = 4
	chartColors    = 6 // .c0 … .c5 in console.css
)

type chart struct {
	ID, Title  string // the element ids' stem and the heading
	Width      int
	Height     int
	ViewHeight int    // the plot, the scale's label above it and the days' below
	Max        string // the tallest day's figure: the top of the scale
	Unit       string // "USD" or "tokens"
	Bars       []chartBar
	Legend     []chartLegend
	Days       []chartDay
	Models     []string // the table's columns
	Empty      bool
}

type chartBar struct {
	X, Y, W, H int
	Color      int
	Title      string // what a screen reader and a hover say
}

type chartLegend struct {
	Model string
	Color int
}

// chartDay is one day of a chart, for its axis and its table.
type chartDay struct {
	Date   string
	Label  string // the axis label, every 7th day
	Anchor string // the label's text-anchor: the last day's ends at the edge
	X      int
	Values []template.HTML // each model's figure, in Models' order
	Total  template.HTML
}

// chartAcc sums the charged days into the two charts' figures.
type chartAcc struct {
	first  time.Time
	spend  [chartDays]map[string]tollgate.Amount
	tokens [chartDays]map[string]int64
	models []string
}

func newChartAcc(first time.Time) *chartAcc { return &chartAcc{first: first} }

func (a *chartAcc) add(t time.Time, model string, spent tollgate.Amount, tokens int64) {
	day := int(t.Sub(a.first) / (24 * time.Hour))
	if day < 0 || day >= chartDays {
		return
	}
	if a.spend[day] == nil {
		a.spend[day] = map[string]tollgate.Amount{}
		a.tokens[day] = map[string]int64{}
	}
	if !slices.Contains(a.models, model) {
		a.models = append(a.models, model)
	}
	a.spend[day][model] += spent
	a.tokens[day][model] += tokens
}

// scaled is v's height in a plot of height h where max is the full height,
// in integers: amounts are never turned into floats.
func scaled(v, max int64, h int) int {
	if max <= 0 || v <= 0 {
		return 0
	}
	unit := max / 10_000 // a ten-thousandth of the scale, so v/unit fits any int64 math below
	if unit == 0 {
		return int(v * int64(h) / max)
	}
	return int((v / unit) * int64(h) / (max / unit))
}

// charts renders the spend chart and the tokens chart.
func (a *chartAcc) charts() (spend, tokens chart) {
	slices.Sort(a.models)
	spend = a.render("spend", "Spend per day by model", "USD", func(d int, m string) int64 { return int64(a.spend[d][m]) },
		func(v int64) string { return rounded(tollgate.Amount(v)) }, func(v int64) string { return fixed12(tollgate.Amount(v)) })
	tokens = a.render("tokens", "Tokens per day by model", "tokens", func(d int, m string) int64 { return a.tokens[d][m] },
		groupDigits, nil)
	return spend, tokens
}

// render draws one chart from value(day, model), written by format, and
// by exact too where format rounds (amounts).
func (a *chartAcc) render(id, title, unit string, value func(day int, model string) int64, format, exact func(int64) string) chart {
	cell := func(v int64) template.HTML {
		if exact != nil {
			return money(tollgate.Amount(v))
		}
		return template.HTML(template.HTMLEscapeString(format(v)))
	}
	hover := func(v int64) string {
		if exact != nil {
			return format(v) + " " + unit + " (exactly " + exact(v) + ")"
		}
		return format(v) + " " + unit
	}
	c := chart{ID: id, Title: title, Unit: unit, Width: chartW, Height: chartH, ViewHeight: chartH + 36, Models: a.models}
	var totals [chartDays]int64
	var top int64
	for d := range chartDays {
		for _, m := range a.models {
			totals[d] += value(d, m)
		}
		top = max(top, totals[d])
	}
	c.Empty = top <= 0
	c.Max = format(top)
	slot := chartW / chartDays
	for i, m := range a.models {
		c.Legend = append(c.Legend, chartLegend{Model: m, Color: i % chartColors})
	}
	for d := range chartDays {
		date := a.first.AddDate(0, 0, d)
		day := chartDay{Date: date.Format(time.DateOnly), X: chartLeft + d*slot + slot/2, Total: cell(totals[d])}
		if (chartDays-1-d)%7 == 0 {
			day.Label, day.Anchor = date.Format("Jan 2"), "middle"
			if d == chartDays-1 {
				day.Anchor = "end"
			}
		}
		y := chartH
		for i, m := range a.models {
			v := value(d, m)
			day.Values = append(day.Values, cell(v))
			h := scaled(v, top, chartH)
			if v > 0 && h == 0 {
				h = 1 // a figure too small for the scale still shows
			}
			if h == 0 {
				continue
			}
			y -= h
			c.Bars = append(c.Bars, chartBar{X: chartLeft + d*slot + barGap/2, Y: y, W: slot - barGap, H: h, Color: i % chartColors,
				Title: day.Date + " · " + m + " · " + hover(v)})
		}
		c.Days = append(c.Days, day)
	}
	return c
}
