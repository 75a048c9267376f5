# plot_policies.gp: the policy study (hitrate policies writes the TSV files this reads): block
# hit rate against budget, one panel per workload, every policy beside the two references.
# Usage: gnuplot -e "dir='bench/out'" bench/hitrate/plot_policies.gp
#        -> dir/policies_long.png, dir/policies_short.png
if (!exists("dir")) dir = 'bench/out'
set terminal pngcairo size 1600,900 font ",10" noenhanced
set datafile separator "\t"
set grid
set logscale x 2
set xrange [0.2:40]
set xtics ("0.25" 0.25, "1" 1, "4" 4, "16" 16, "32" 32)
set yrange [0:100]
set key autotitle columnhead
# lru, tinylfu, lfuda, gdsf, tlfu-gdsf, adaptive (thick), oracle (dotted), belady (dashed).
set linetype 1 lc rgb "#1f77b4" lw 2 pt 1
set linetype 2 lc rgb "#2ca02c" lw 2 pt 2
set linetype 3 lc rgb "#9467bd" lw 1 pt 3
set linetype 4 lc rgb "#17becf" lw 1 pt 4
set linetype 5 lc rgb "#bcbd22" lw 1 pt 5
set linetype 6 lc rgb "#d62728" lw 3 pt 7
set linetype 7 lc rgb "#808080" lw 1 pt 0 dt 3
set linetype 8 lc rgb "#000000" lw 2 pt 0 dt 2
names = "zipf-2.1 zipf-1.5 zipf-1.1 shift-1.1 burst-1.1 session-1.1 mix-1.1"
do for [len in "long short"] {
    set output dir.'/policies_'.len.'.png'
    set multiplot layout 2,4 title "Block hit rate (%) against budget (GiB), ".len." documents (".(len eq "long" ? "2048 tokens, k = 5" : "lognormal median 270, k = 6").")"
    do for [w=0:6] {
        set title word(names, w + 1)
        if (w == 0) { set key bottom right font ",8" } else { unset key }
        plot for [i=2:9] dir.'/policies_'.len.'.tsv' index w using 1:i with linespoints lt i-1
    }
    unset multiplot
}
