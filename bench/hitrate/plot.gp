# plot.gp: plots of the hit-rate study (hitrate study writes the TSV files this reads).
# Usage: gnuplot -e "dir='bench/out'" bench/hitrate/plot.gp   -> dir/budget.png, dir/skew_*.png
if (!exists("dir")) dir = 'bench/out'
set terminal pngcairo size 1000,640 font ",11" noenhanced
set datafile separator "\t"
set key outside right top autotitle columnhead
set grid
set ylabel "block hit rate (%)"
set yrange [0:100]
n = 14  # columns: x + 13 series, in the order hitrate.c's study_series lists them
# Position-aware models red/orange (dashed: with the best policy), lazykv's blues/greens/black.
set linetype 1 lc rgb "#808080" lw 2 pt 1 dt 1
set linetype 2 lc rgb "#d62728" lw 2 pt 2 dt 1
set linetype 3 lc rgb "#ff7f0e" lw 2 pt 3 dt 1
set linetype 4 lc rgb "#1f77b4" lw 2 pt 4 dt 1
set linetype 5 lc rgb "#17becf" lw 2 pt 5 dt 1
set linetype 6 lc rgb "#9467bd" lw 2 pt 6 dt 1
set linetype 7 lc rgb "#2ca02c" lw 3 pt 7 dt 1
set linetype 8 lc rgb "#000000" lw 2 pt 8 dt 1
set linetype 9 lc rgb "#d62728" lw 2 pt 9 dt 2
set linetype 10 lc rgb "#ff7f0e" lw 2 pt 10 dt 2
set linetype 11 lc rgb "#808080" lw 1 pt 0 dt 3
set linetype 12 lc rgb "#e377c2" lw 3 pt 12 dt 1
set linetype 13 lc rgb "#000000" lw 1 pt 0 dt 2

set output dir.'/budget.png'
set title "Hit rate against budget (Zipf alpha = 1.5, 2048-token documents, 128 KiB/token)"
set logscale x
set xrange [0.4:1300]
set xlabel "KV budget (GiB)"
set xtics ("0.5" 0.5, "1" 1, "2" 2, "5" 5, "10" 10, "20" 20, "50" 50, "100" 100, "200" 200, "no limit" 1000)
plot for [i=2:n] dir.'/budget.tsv' using 1:i with linespoints lt i-1
unset logscale x
set xrange [0:2.6]
set xtics autofreq

do for [g in "1 10"] {
    set output dir.'/skew_'.g.'gib.png'
    set title "Hit rate against skew (budget ".g." GiB, 2048-token documents, 128 KiB/token)"
    set xlabel "Zipf alpha (0 = uniform)"
    plot for [i=2:n] dir.'/skew_'.g.'gib.tsv' using 1:i with linespoints lt i-1
}
