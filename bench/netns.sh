# Sourced by the benchmarks' --netns modes (compare.sh, rds_compare.sh): two network
# namespaces joined by a veth pair, as two hosts would be, so that every byte crosses TCP
# through a real (virtual) link rather than loopback.
# netns_up <n>: makes them (root), with the server side at 10.83.<n>.2 on $VS in $NS_S and
# the client side at 10.83.<n>.1 on $VC in $NS_C; SADDR and CADDR are those addresses.
# netns_del: removes them (and the veth pair with them).
netns_up() {
  NS_S=svbs_$$ NS_C=svbc_$$ VS=svs$$ VC=svc$$
  SADDR=10.83.$1.2 CADDR=10.83.$1.1
  ip netns add "$NS_S" && ip netns add "$NS_C" || { echo "$0 --netns: needs root" >&2; exit 1; }
  ip link add "$VC" type veth peer name "$VS"
  ip link set "$VS" netns "$NS_S"
  ip link set "$VC" netns "$NS_C"
  ip -n "$NS_S" addr add "$SADDR/24" dev "$VS"
  ip -n "$NS_C" addr add "$CADDR/24" dev "$VC"
  for n in "$NS_S" "$NS_C"; do ip -n "$n" link set lo up; done
  ip -n "$NS_S" link set "$VS" up
  ip -n "$NS_C" link set "$VC" up
  sleep 1  # the veth pair up
}
netns_del() {
  ip netns del "$NS_S" 2>/dev/null
  ip netns del "$NS_C" 2>/dev/null
  return 0
}
