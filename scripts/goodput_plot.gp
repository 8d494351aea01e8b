# SLO attainment against the request rate for each setup of scripts/bench_goodput.sh, which
# calls it as: gnuplot -e "load 'SETTINGS'; data = 'TSV'; out = 'SVG'" scripts/goodput_plot.gp
# SETTINGS defines target (%), slo (the targets' text), n (setups: 1 or 2) and name0, name1
# (legend); TSV has one row per rate: the rate, then per setup the attainment (%) of both
# targets, of TTFT alone and of TPOT alone ("?": not run).
set terminal svg size 760,440 dynamic font "sans,12" background "white"
set output out
set datafile separator "\t"
set datafile missing "?"
set title "SLO attainment against request rate (".slo.")"
set xlabel "Poisson request rate (req/s)"
set ylabel "requests meeting the target (%)"
set yrange [0:105]
set key bottom left box opaque
set grid
set style line 1 lc rgb "#1f77b4" lw 2.5 pt 7
set style line 2 lc rgb "#d62728" lw 2.5 pt 5
set arrow from graph 0, first target to graph 1, first target nohead dt 2 lc rgb "#555555"
set label sprintf("attainment target %g %%", target) at graph 0.26, first target + 2.5 left \
  textcolor rgb "#555555"
name(i) = i == 0 ? name0 : name1
plot for [i=0:n-1] data using 1:(column(2 + 3 * i)) with linespoints ls (i + 1) \
       title name(i) . ": both targets", \
     for [i=0:n-1] data using 1:(column(4 + 3 * i)) with lines ls (i + 1) lw 1 dt 3 \
       title name(i) . ": TPOT alone"
