package console

import (
	"slices"
	"time"

	"github.com/tollgate/tollgate"
)

// The overview's chart: spend per day by model over the last chartDays
// days, as stacked bars in an SVG drawn here (no script, no chart library).

const (
	chartW, chartH = 720, 200 // the plot, in SVG units
	chartLeft      = 0
	barGap         = 4
	chartColors    = 6 // .c0 … .c5 in console.css
)

type chart struct {
	Width, Height int
	ViewHeight    int             // the plot, the scale's label above it and the days' below
	Max           tollgate.Amount // the tallest day's spend: the top of the scale
	Bars          []chartBar
	Legend        []chartLegend
	Days          []chartDay
	Empty         bool
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

// chartDay is one day's total, for the table beside the chart.
type chartDay struct {
	Date   string
	Label  string // the axis label, every 7th day
	Anchor string // the label's text-anchor: the last day's ends at the edge
	X      int
	Spend  tollgate.Amount
}

type chartAcc struct {
	first  time.Time
	spend  [chartDays]map[string]tollgate.Amount
	models []string
}

func newChartAcc(first time.Time) *chartAcc { return &chartAcc{first: first} }

func (a *chartAcc) add(t time.Time, model string, spent tollgate.Amount) {
	day := int(t.Sub(a.first) / (24 * time.Hour))
	if day < 0 || day >= chartDays {
		return
	}
	if a.spend[day] == nil {
		a.spend[day] = map[string]tollgate.Amount{}
	}
	if _, seen := a.spend[day][model]; !seen && !slices.Contains(a.models, model) {
		a.models = append(a.models, model)
	}
	a.spend[day][model] += spent
}

// scaled is v's height in a plot of height h where max is the full height,
// in integers: amounts are never turned into floats.
func scaled(v, max tollgate.Amount, h int) int {
	if max <= 0 || v <= 0 {
		return 0
	}
	unit := max / 10_000 // a ten-thousandth of the scale, so v/unit fits any int64 math below
	if unit == 0 {
		return int(int64(v) * int64(h) / int64(max))
	}
	return int(int64(v/unit) * int64(h) / int64(max/unit))
}

func (a *chartAcc) render() chart {
	slices.Sort(a.models)
	c := chart{Width: chartW, Height: chartH, ViewHeight: chartH + 36}
	var totals [chartDays]tollgate.Amount
	for d := range chartDays {
		for _, v := range a.spend[d] {
			totals[d] += v
		}
		c.Max = max(c.Max, totals[d])
	}
	c.Empty = c.Max <= 0
	slot := chartW / chartDays
	for i, m := range a.models {
		c.Legend = append(c.Legend, chartLegend{Model: m, Color: i % chartColors})
	}
	for d := range chartDays {
		date := a.first.AddDate(0, 0, d)
		day := chartDay{Date: date.Format(time.DateOnly), X: chartLeft + d*slot + slot/2, Spend: totals[d]}
		if (chartDays-1-d)%7 == 0 {
			day.Label, day.Anchor = date.Format("Jan 2"), "middle"
			if d == chartDays-1 {
				day.Anchor = "end"
			}
		}
		c.Days = append(c.Days, day)
		y := chartH
		for i, m := range a.models {
			v := a.spend[d][m]
			h := scaled(v, c.Max, chartH)
			if v > 0 && h == 0 {
				h = 1 // a spend too small for the scale still shows
			}
			if h == 0 {
				continue
			}
			y -= h
			c.Bars = append(c.Bars, chartBar{X: chartLeft + d*slot + barGap/2, Y: y, W: slot - barGap, H: h, Color: i % chartColors,
				Title: day.Date + " · " + m + " · " + usd(v) + " USD"})
		}
	}
	return c
}
