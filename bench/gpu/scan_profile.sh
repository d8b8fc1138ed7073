#!/bin/bash
# Nsight Compute on two selective-scan pack kernels at batch 1, L 4096 (bench/gpu/scan_profile.py): speed of
# light, occupancy, scheduler, warp stall reasons and instruction mix, to see what bounds them.
set -u
export PYTHONUNBUFFERED=1
{ date -u; uptime; nvidia-smi --query-gpu=name,memory.used,utilization.gpu --format=csv; ncu --version | tail -1; } > $OUT/machine.txt 2>&1
timeout 400 ncu --kernel-name ss_warp_chunks --section SpeedOfLight --section Occupancy --section SchedulerStats \
  --section WarpStateStats --section InstructionStats --section ComputeWorkloadAnalysis --section LaunchStats \
  python3 bench/gpu/scan_profile.py 4096 "warp-chunks 8i 8w 2u smem ff" "warp-chunks 8i 8w 4u smem-f32 sum ff r128" \
  > $OUT/ncu.txt 2>&1; echo "rc $?" >> $OUT/ncu.txt
grep -E "launched|ss_warp_chunks|Duration|Registers|Achieved Occupancy|Theoretical Occupancy|Issued Ipc|Issue Slots Busy|No Eligible|Eligible Warps|Active Warps Per|Warp Cycles Per Issued|Executed Ipc|Compute \(SM\) Throughput|Memory Throughput|SM Busy|Block Limit|rc " $OUT/ncu.txt | head -80
