set terminal pngcairo size 900,560 noenhanced
set output 'bench/results/all_reduce_cpu8.png'
set logscale x 2
set logscale y 10
set format x '%.0b%B'
set key left top
set xlabel 'size (bytes per device)'
set ylabel 'busbw (GB/s, log scale)'
set grid
set title 'meshrt-bench all_reduce, 8 cpu devices, modelled: ring, alpha 5 us, beta 100 GB/s per directed link'
plot 'bench/results/all_reduce_cpu8.png.dat' index 0 using 1:2 with linespoints lw 2 title 'direct (measured)', 'bench/results/all_reduce_cpu8.png.dat' index 0 using 1:3 with lines dt 2 lw 2 title 'direct (modelled)', 'bench/results/all_reduce_cpu8.png.dat' index 1 using 1:2 with linespoints lw 2 title 'ring (measured)', 'bench/results/all_reduce_cpu8.png.dat' index 1 using 1:3 with lines dt 2 lw 2 title 'ring (modelled)', 'bench/results/all_reduce_cpu8.png.dat' index 2 using 1:2 with linespoints lw 2 title 'bidi_ring (measured)', 'bench/results/all_reduce_cpu8.png.dat' index 2 using 1:3 with lines dt 2 lw 2 title 'bidi_ring (modelled)'
