/* Real, linkable symbols for DPDK's `static inline` fast path, so Rust can call them.
 * Each function is a direct forward; the inline bodies are compiled here with the same flags
 * (pkg-config --cflags libdpdk) as the DPDK headers expect. */
#include "wrapper.h"

uint16_t lvk_rte_eth_rx_burst(uint16_t port_id, uint16_t queue_id, struct rte_mbuf **rx_pkts,
                              uint16_t nb_pkts)
{
	return rte_eth_rx_burst(port_id, queue_id, rx_pkts, nb_pkts);
}

uint16_t lvk_rte_eth_tx_burst(uint16_t port_id, uint16_t queue_id, struct rte_mbuf **tx_pkts,
                              uint16_t nb_pkts)
{
	return rte_eth_tx_burst(port_id, queue_id, tx_pkts, nb_pkts);
}

struct rte_mbuf *lvk_rte_pktmbuf_alloc(struct rte_mempool *mp)
{
	return rte_pktmbuf_alloc(mp);
}

int lvk_rte_pktmbuf_alloc_bulk(struct rte_mempool *mp, struct rte_mbuf **mbufs, unsigned count)
{
	return rte_pktmbuf_alloc_bulk(mp, mbufs, count);
}

void lvk_rte_pktmbuf_free(struct rte_mbuf *m)
{
	rte_pktmbuf_free(m);
}

void *lvk_rte_pktmbuf_mtod(struct rte_mbuf *m)
{
	return rte_pktmbuf_mtod(m, void *);
}

uint16_t lvk_rte_pktmbuf_data_len(const struct rte_mbuf *m)
{
	return rte_pktmbuf_data_len(m);
}

uint32_t lvk_rte_pktmbuf_pkt_len(const struct rte_mbuf *m)
{
	return rte_pktmbuf_pkt_len(m);
}

uint16_t lvk_rte_pktmbuf_nb_segs(const struct rte_mbuf *m)
{
	return m->nb_segs;
}

uint16_t lvk_rte_pktmbuf_headroom(const struct rte_mbuf *m)
{
	return rte_pktmbuf_headroom(m);
}

uint16_t lvk_rte_pktmbuf_tailroom(const struct rte_mbuf *m)
{
	return rte_pktmbuf_tailroom(m);
}

char *lvk_rte_pktmbuf_append(struct rte_mbuf *m, uint16_t len)
{
	return rte_pktmbuf_append(m, len);
}

char *lvk_rte_pktmbuf_prepend(struct rte_mbuf *m, uint16_t len)
{
	return rte_pktmbuf_prepend(m, len);
}

char *lvk_rte_pktmbuf_adj(struct rte_mbuf *m, uint16_t len)
{
	return rte_pktmbuf_adj(m, len);
}

int lvk_rte_pktmbuf_trim(struct rte_mbuf *m, uint16_t len)
{
	return rte_pktmbuf_trim(m, len);
}

void lvk_rte_pktmbuf_reset(struct rte_mbuf *m)
{
	rte_pktmbuf_reset(m);
}

int lvk_rte_errno(void)
{
	return rte_errno;
}

unsigned lvk_rte_lcore_id(void)
{
	return rte_lcore_id();
}
