# Plots bench/shm_compare.sh's shm.csv: gnuplot -e "out='DIR'; day='YYYY-MM-DD'" bench/plot_shm.gp
# Each figure is a speed relative to its anchor, UCX's shared-memory transports in the same run
# (posix am_lat / am_bw for 8 B, cma put_bw / get for 1 MiB): higher is better, 1 = as fast.
set datafile separator ","
set terminal pngcairo size 1000,560 noenhanced
set output out."/shm.png"
set title "One host: softverbs against UCX shared memory, same run (".day.")"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set ylabel "speed relative to the anchor (higher is better)"
set yrange [0:*]
set key left top
set grid ytics
plot out."/shm.csv" skip 1 using 2:xtic(1) title "softverbs, shared memory", \
     "" skip 1 using 3 title "softverbs, TCP", \
     "" skip 1 using 4 title "goal" fillstyle pattern 4
