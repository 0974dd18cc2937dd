# Plots bench/sweep.sh's CSV files: gnuplot -e "out='DIR'; day='YYYY-MM-DD'" bench/plot.gp
set datafile separator ","
set terminal pngcairo size 900,560 noenhanced
set output out."/bw.png"
set title "Bandwidth against message size, loopback, one run (".day.")"
set logscale x 2
set format x "%.0b%BB"
set xlabel "message size"
set ylabel "MB/s"
set key left top
set grid
plot out."/bw.csv" skip 1 using 1:2 with linespoints title "softverbs RDMA WRITE", \
     "" skip 1 using 1:3 with linespoints title "softverbs RDMA READ", \
     "" skip 1 using 1:4 with linespoints title "softverbs SEND", \
     "" skip 1 using 1:5 with lines dt 2 lw 2 title "anchor: qperf tcp_bw", \
     "" skip 1 using 1:6 with lines dt 3 lw 2 title "anchor: UCX tcp put_bw"
set output out."/lat.png"
unset logscale x
set format x "%g"
unset xlabel
set title "One-way latency percentiles, 8 B, loopback (".day.")"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8
set ylabel "us"
set logscale y
set key left top
plot out."/lat.csv" skip 1 using 2:xtic(1) title "min", "" skip 1 using 3 title "typical", \
     "" skip 1 using 4 title "99%", "" skip 1 using 5 title "99.9%"
