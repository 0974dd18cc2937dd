# Plots bench/rds_compare.sh's CSV files:
#   gnuplot -e "out='DIR'; day='YYYY-MM-DD'" bench/plot_rds.gp
set datafile separator ","
set terminal pngcairo size 1100,520 noenhanced
set output out."/rds.png"
set multiplot layout 1,2 title "RDS (rds-stress, rds-ping) beside raw verbs on softverbs, loopback, one run (".day.")"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8
set grid y
set key below
set title "round trip, 64 B: rds-stress request/ack; rds-ping median (lower is better)"
set ylabel "us"
set yrange [0:*]
plot out."/rds_rtt.csv" skip 1 using 2:xtic(1) title "RDS", "" skip 1 using 3 title "raw verbs: 2 x ib_send_lat", \
     "" skip 1 using 4 title "blocking TCP: 2 x qperf tcp_lat"
set title "RDMA WRITE 1 MiB, rds-stress -M 2 (higher is better)"
set ylabel "MB/s per direction"
plot out."/rds_rdma.csv" skip 1 using 2:xtic(1) title "RDS (both directions at once)", \
     "" skip 1 using 3 title "ib_write_bw", "" skip 1 using 4 title "ib_write_bw -b"
unset multiplot
